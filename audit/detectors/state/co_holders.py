"""Which call changed an object of a library class that the target reaches through two holders.

An LR scheduler writes the new lr into its optimizer's `param_groups` (`sched.step()` -> `_update_lr` ->
`param_group["lr"] = lr`), and the target holds that optimizer too (`self.opt`). The change is inside the
optimizer, so the search for its site first finds the target's calls of the optimizer's own methods
(`self.opt.step()`, `self.opt.zero_grad()`). When none of those methods writes the attribute in its own
source, and another object the target holds keeps the changed object in an attribute (`sched.optimizer`),
the target's calls into that holder are the sites: it is what reached in and changed it.
"""

from __future__ import annotations

import inspect

from audit.detectors.source import mutations
from audit.scan.snapshot.own_dict import own_dict

__all__ = ["instead"]


def _writes(cls: type, method: str, attr: str) -> bool | None:
    """Whether `cls.method`'s own source writes `<x>.attr`; None when it has no source to read."""
    fn = inspect.unwrap(getattr(cls, method, None)) if callable(getattr(cls, method, None)) else None
    try:
        lines, start = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn)
    except (OSError, TypeError):
        return None
    return bool(file) and bool(mutations.mutation_sites(file, attr, (start, start + len(lines))))


def _holders(ctx, obj, own: set) -> list[str]:
    """Top-level attributes of the target that hold another library object (a class outside the target's
    files, whose code the search did not read) keeping `obj` in an attribute of its own."""
    out = []
    for path, other in ctx.trace.objects:
        if not path or other is obj or "." in path or _source_file(type(other)) in own:
            continue
        if any(v is obj for v in list(own_dict(other).values())):
            out.append(path)
    return out


def _source_file(cls: type) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except TypeError:
        return None


def instead(ctx, change, calls: list, note: str, methods: set, ran: set) -> tuple[list, str]:
    """The target's calls into a co-holder of the changed object when the object's own methods the target
    called do not write the attribute; else (calls, note) unchanged."""
    from audit.detectors.state.sites import object_at

    obj = object_at(ctx, change.owner)
    attr = change.attr.split(".")[-1]
    if obj is None or not methods or any(_writes(type(obj), m, attr) is not False for m in methods):
        return calls, note
    files = ctx.own_files()
    hits = [((f, fn) in ran, f, line, fn, m, h) for h in _holders(ctx, obj, set(files)) for f in files
            for line, fn, m in mutations.method_calls(f, h) if fn not in ("__init__", "prepare")]
    best = [x for x in hits if x[0]]
    if not best:
        return calls, note
    kinds = ", ".join(dict.fromkeys(f"`{h}.{m}()`" for *_, m, h in best[:3]))
    return [(f, line, fn) for _, f, line, fn, _, _ in best[:3]], f"inside a `{type(obj).__qualname__}`, through {kinds}"
