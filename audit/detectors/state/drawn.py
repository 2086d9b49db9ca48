"""The statement that drew from a host random generator the target holds, among those the step ran.

A generator's state changes through calls on it (`self.rng.random()`, gymnasium's `self.np_random.integers(n)`
through the `np_random` property returning `self._np_random`), never through the statements that assign the
attribute (a `seed()` that did not run, `__setstate__`'s `self.__dict__.update(state)`). The calls are read from
the holder's source, directly on the attribute or through such a property, and kept when their line ran in the
step (audit/scan/sources/rng_lines.py records the lines of the functions that name them).
"""

from __future__ import annotations

import ast

from audit.detectors.source import lookup, mutations
from audit.detectors.state.sites import whole_state_fp
from audit.scan.sources.ast_nodes import nodes_of

__all__ = ["sites"]


def _accessors(file: str, span, attr: str) -> set[str]:
    """Names of the properties in `file` (within `span`) whose getter returns `self.<attr>`."""
    t = lookup.tree(file)
    out = set()
    for fn in nodes_of(t, (ast.FunctionDef, ast.AsyncFunctionDef)) if t is not None else ():
        if span and not span[0] <= fn.lineno <= span[1]:
            continue
        if not any(isinstance(d, ast.Name) and d.id in ("property", "cached_property") or
                   isinstance(d, ast.Attribute) and d.attr == "cached_property" for d in fn.decorator_list):
            continue
        if any(isinstance(n, ast.Return) and isinstance(n.value, ast.Attribute) and n.value.attr == attr
               for n in ast.walk(fn)):
            out.add(fn.name)
    return out


def sites(ctx, change, step: int, files) -> list:
    """(file, line, function) of the calls on a host generator held in `change.attr` that ran in `step`; [] for any
    other change, or when no line was recorded."""
    ran = ctx.trace.ran_lines[step] if step < len(getattr(ctx.trace, "ran_lines", ())) else None
    if not ran or not whole_state_fp(change.after):
        return []
    attr = change.attr.split(".")[-1]
    names = {attr} | {a for f, span, _ in files if f for a in _accessors(f, span, attr)}
    out = [(f, line, fn) for f, span, glob in files if f for name in sorted(names)
           for line, fn, _ in mutations.method_calls(f, name, global_name=glob)
           if (f, line) in ran and (not span or span[0] <= line <= span[1])]
    return list(dict.fromkeys(out))[:3]
