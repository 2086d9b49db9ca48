"""A library's module-level registry filled on first use, in the step that first ran the code filling it.

einops keeps its backends in module dicts (`_loaded_backends`, `_type2backend`) that `get_backend(x)` fills the
first time it sees a tensor type. fla's chunked gated-delta-rule reference calls `rearrange`, so a layer that takes
that kernel only past a context length fills them in the first step that crosses the bound. That is lazy
initialization, done once per process, not state the step advances: a replay that skips it leaves nothing stale
(the next eager call finds the registry filled, or fills it). The step ran it because it took a new arm, which is
the data-dependent-control finding; the fill is info. The same holds for a private member of a library or
standard-library object the target keeps: a `logging.Logger`'s `_cache` of enabled levels, filled by the first
`log.debug(...)` the step runs under a branch (`if self.n % 4 == 0:`), is memoisation, not state a replay leaves
stale.
"""

from __future__ import annotations

import sys

from audit.scan.sources import loaded
from audit.scan.sources.user_code import HIDDEN, LIBRARY, frame_kind

__all__ = ["NOTE", "first_fill", "under_fill"]

NOTE = ("; it was empty before and the target's line that led there ran in no earlier audited step: a library's "
        "lazy first-use fill (a new branch arm ran it; see data-dependent-control), not per-step state")
_SIZED = ("list", "dict", "set", "deque")


def first_fill(ctx, owner: str, attr: str, hits: list, caller, changed: dict) -> bool:
    """Whether the changes of one library module global (`hits`: [(step, change)]) are a first fill: one audited
    step only, not the first, empty or unset before and holding members after (or an attribute set on an object
    the same step first put in such a global: `_BACKENDS['torch'].torch`), reached from the target's line
    `caller` (file, line, function) that no earlier audited step ran. `changed`: (owner, attr) -> hits."""
    if len(hits) != 1 or caller is None or not (_library_module(ctx, owner) or _library_private(ctx, owner, attr)):
        return False
    s, c = hits[0]
    if s == 0 or not (_fills(c) or _inside_fill(owner, attr, s, c, changed)):
        return False
    return not any((code.co_filename, line) == (caller[0], caller[1])
                   for k in range(s) for r in ctx.steps[k] for code, line in r.stack)


def under_fill(owner: str, attr: str, before, filled: set) -> bool:
    """An attribute set on an object a first fill just put in the registry (`_loaded_backends['torch'].torch`)."""
    head = attr.split("[")[0].split(".")[0]
    return before == "<unset>" and (owner, head) in filled


def _library_private(ctx, owner: str, attr: str) -> bool:
    """`attr` is a private member (`log._cache`) of an object, held by the owner, whose class is a library's or the
    standard library's."""
    parts = attr.split("[")[0].split(".")
    if len(parts) != 2 or not parts[1].startswith("_") or parts[1].startswith("__"):
        return False
    if owner.startswith("<module "):
        holder = loaded.module_named(owner[8:-1])
    elif owner.startswith("<"):
        return False
    else:
        holder = next((obj for p, obj in ctx.trace.objects if p == owner), None)
    obj = getattr(holder, parts[0], None) if holder is not None else None
    f = getattr(sys.modules.get(type(obj).__module__), "__file__", None) if obj is not None else None
    return bool(f) and frame_kind(f, ctx.trace.roots) in (HIDDEN, LIBRARY)


def _fills(c) -> bool:
    return _empty(c.before) and _members(c.after)


def _inside_fill(owner: str, attr: str, step: int, c, changed: dict) -> bool:
    head = attr.split("[")[0].split(".")[0]
    hits = changed.get((owner, head), ())
    return c.before == "<unset>" and head != attr and len(hits) == 1 and hits[0][0] == step and _fills(hits[0][1])


def _library_module(ctx, owner: str) -> bool:
    if not owner.startswith("<module "):
        return False
    f = getattr(loaded.module_named(owner[8:-1]), "__file__", None)
    return bool(f) and frame_kind(f, ctx.trace.roots) == LIBRARY


def _empty(fp) -> bool:
    return fp == "<unset>" or (isinstance(fp, tuple) and len(fp) == 3 and fp[0] in _SIZED and fp[1] == 0)


def _members(fp) -> bool:
    return isinstance(fp, tuple) and len(fp) == 3 and fp[0] in _SIZED and (fp[1] or 0) > 0
