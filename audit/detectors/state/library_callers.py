"""Where a Python state change in library code came from in the target: the library code that ran no torch op
(a metrics object's `self._value += amount`, a streamer's `self._q.put(ids)`) leaves no stack to read, so the
target's own call into the object (`self.streamer.put(ids)`, `TOKENS.inc(2)`) or into the function
(`with region("mlp"):`) is found in its source. Shared by the cpu-side-effect rules."""

from __future__ import annotations

import ast
import contextlib
import inspect
import re
import sys

from audit.detectors.state import handoff
from audit.detectors.source import implicit, lookup, mutations
from audit.detectors.state.sites import object_at
from audit.scan.snapshot import state
from audit.scan.sources import loaded
from audit.scan.sources.ast_nodes import nodes_of

__all__ = ["executed", "head", "holder", "user_call_into", "user_call_of"]


def executed(ctx, step: int, own_only: bool = False) -> set:
    """(file, function) pairs that ran in the step (from the op stacks): library code included, unless own_only."""
    out = set()
    for r in ctx.steps[step]:
        for code, _ in r.stack:
            if not own_only or ctx.trace.is_own(code):
                out.add((code.co_filename, code.co_name))
    return out


def head(attr: str) -> str:
    """The global's own name in a state key: `_REGISTRY` of `_REGISTRY['decode'].count`."""
    return re.match(r"[^.\[]*", attr).group(0)


_STDLIB = frozenset(sys.stdlib_module_names) | {"torch"}


def holder(ctx, owner: str) -> tuple[str | None, list[str]]:
    """The attribute that holds the object at `owner` (`callbacks.0.__self__.out` -> `out`) and the
    source files of the object that holds it (the user's or a library's, not the standard library's)."""
    parts = owner.split(".")
    for i in range(len(parts) - 1, -1, -1):
        parent = object_at(ctx, ".".join(parts[:i]))
        if parent is not None and parts[i] in dict(state._instance_items(parent)):
            files = []
            for cls in type(parent).__mro__[:-1]:
                if (cls.__module__ or "").split(".")[0] in _STDLIB:  # queue.Queue's own deque: not a site
                    continue
                try:
                    files.append(inspect.getsourcefile(cls))
                except TypeError:
                    continue
            # the holder's class may be library code (a serving library's streamer): its line is the site
            return parts[i], [f for f in files if f]
    return None, []


def user_call_into(ctx, change, step: int, own_files: set, site_fn: str = ""):
    """For a site in library code that ran no torch op (a streamer's `self._q.put(ids)`): the target's
    own call of a method of the library object (`self.streamer.put(ids)`), found in the target's source
    from the attribute that holds the object; for a site in a dunder or a property the syntax runs (a proxy's
    `__getattr__`: `self.mlp.scale`), the target's line with that syntax on the object; None when there is none."""
    glob = change.owner.startswith("<module ")
    if glob:  # a global's held object (`MAXL._sum._value`): the call on the global (`MAXL.observe(v)`) in own code
        name, files = head(change.attr), [getattr(loaded.module_named(change.owner[8:-1]), "__file__", None)]
    elif change.owner.startswith("<"):
        return None
    else:
        name, files = holder(ctx, change.owner.split(".")[0])  # the target's attribute and its class's files
    ran = executed(ctx, step)
    files = [f for f in files if f in own_files] if name else []
    calls = [] if glob else [((f, fn) not in ran, False, line, f, fn) for f in files
                             for line, fn in implicit.implicit_uses(f, name, site_fn) if fn not in ("__init__", "prepare")]
    calls = calls or [((f, fn) not in ran, m != site_fn, line, f, fn) for f in files  # the site's method's call first
                      for line, fn, m in mutations.method_calls(f, name, global_name=glob)
                      if fn not in ("__init__", "prepare")]
    if not calls:
        return None
    _, _, line, f, fn = min(calls)
    return (f, line, fn)


def _resolves_to(filename: str, func: ast.expr, file: str, fn: str) -> bool:
    """Whether the callee `region` or `profile.region`, read in the globals of the module loaded from
    `filename`, is (a wrapper of) function `fn` of `file` (`region` a @contextmanager)."""
    obj = handoff.resolve(filename, func)
    with contextlib.suppress(Exception):
        code = inspect.unwrap(obj).__code__
        return code.co_filename == file and code.co_name == fn
    return False


def user_call_of(ctx, site, step: int, own_files: set):
    """For a site in a library function that ran no torch op and holds no object of the target (a
    @contextmanager's `REGION_COUNTS[name] += 1`, run by `with region("mlp"):` before the body's ops):
    the target's own call of that function, by name (`region(...)`, `profile.region(...)`), in a
    function of the target that ran in the step; None when there is none."""
    file, _, fn = site
    ran = executed(ctx, step, own_only=True)
    hits = []
    for f in own_files:
        t = lookup.tree(f)
        for func in nodes_of(t, (ast.FunctionDef, ast.AsyncFunctionDef)) if t else ():
            for n in ast.walk(func):
                if not isinstance(n, ast.Call):
                    continue
                if getattr(n.func, "id", getattr(n.func, "attr", None)) == fn and _resolves_to(f, n.func, file, fn):
                    hits.append(((f, func.name) not in ran, n.lineno, f, func.name))
    if not hits:
        return None
    _, line, f, name = min(hits)
    return (f, line, name)
