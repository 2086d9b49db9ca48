"""Python containers the source grows: `len()` of one is a host counter, not a size read off a tensor.

`len(t)` of a tensor reads its first dimension, and a shape computed from it follows that tensor's shape. A
list the code appends to (a quantized cache keeping each step's scales in `self.k_scales`, concatenated for
attention) has a length that is a plain counter the step advances: a shape computed from `len(self.k_scales)`
varies on its own, where the slice or factory takes it, whatever tensor happens to share that size."""

from __future__ import annotations

import ast
import functools

from audit.scan.sources.ast_nodes import all_nodes
from audit.scan.sources.frame_source import tree

_GROW = ("append", "extend", "insert", "appendleft", "extendleft")


@functools.lru_cache(maxsize=256)
def _grown_in(filename: str, stamp: int) -> frozenset:
    t = tree(filename)
    out = set()
    for n in all_nodes(t) if t is not None else ():
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _GROW:
            out.add(ast.unparse(n.func.value))
    return frozenset(out)


def grown(filename: str) -> frozenset:
    """The expressions, as written (`self.k_scales`, `scales`), that the file grows with `.append(...)`,
    `.extend(...)` or `.insert(...)`."""
    t = tree(filename)
    return _grown_in(filename, id(t)) if t is not None else frozenset()


def container_len(call: ast.Call, skip: frozenset) -> bool:
    """`len(<x>)` of an expression in `skip` (a grown container)."""
    return isinstance(call.func, ast.Name) and call.func.id == "len" and bool(call.args) and \
        ast.unparse(call.args[0]) in skip
