"""Class attributes a constructor changes when the step makes an instance.

A library object made per call inside the step (`Normalizer(px.device)(px)`, built by a helper the target calls)
counts its instances on its class in `__init__` (`Normalizer.made += 1`). Statements in `__init__` are otherwise
skipped as set-up that ran in make(), but a class attribute that changed during a step can only have changed in
a constructor if an instance was made in that step: the `__init__` statement is the site. Its caller is the
target's line that led into the code constructing the class by name (`processor.normalize(self.px)`), or the
target's own construction of it.
"""

from __future__ import annotations

import ast

from audit.detectors.source import lookup
from audit.detectors.state.sites import called_by_name, caller_of
from audit.scan.sources.ast_nodes import all_nodes

SETUP = ("__init__", "prepare")


def skipped(change, fn: str) -> bool:
    """Whether a statement in function `fn` is set-up that cannot be the step's change: `prepare`, and
    `__init__` unless the change is to a class's own attribute (an instance made in the step; not an object
    kept on the class, whose `__init__` ran when the class was defined)."""
    own = change.owner.startswith("<class ") and "." not in change.attr
    return fn == "prepare" or (fn == "__init__" and not own)


def constructor_call(ctx, site, step: int):
    """For a site in an `__init__`: the target's line that led into code constructing its class by name
    (None when the site is in no `__init__`, or nothing that ran constructs it)."""
    file, line, fn = site
    if fn != "__init__":
        return None
    cls = _class_at(file, line)
    if cls is None:
        return None
    return caller_of(ctx, site, step) or called_by_name(ctx, (file, line, cls), step)


def _class_at(file: str, line: int) -> str | None:
    t = lookup.tree(file)
    for n in all_nodes(t) if t is not None else ():
        if isinstance(n, ast.ClassDef) and n.lineno <= line <= (n.end_lineno or n.lineno):
            inner = [c for c in ast.walk(n) if isinstance(c, ast.ClassDef) and c is not n
                     and c.lineno <= line <= (c.end_lineno or c.lineno)]
            return inner[-1].name if inner else n.name
    return None
