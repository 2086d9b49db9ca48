"""Names a loop binds to the elements of a container attribute: `for group in self.opt.param_groups:`.

A write through such a name (`group["lr"] = lr`) changes the container's element, as a write through a
local bound from it does (`req = self.requests[rid]; req["n"] += 1`). Iterating `zip(...)`, `enumerate(...)`
or a dict's `.values()` / `.items()` binds the element to one place of the loop's target tuple.
"""

from __future__ import annotations

import ast

__all__ = ["element_names"]


def element_names(func, rooted) -> set[str]:
    """Names bound to elements of a container `rooted(expr)` accepts, by `for` loops and comprehensions in `func`."""
    out: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            out |= set(_bound(node.target, node.iter, rooted))
    return out


def _bound(target, it, rooted):
    """The names in `target` that take an element of a rooted container from iterating `it`."""
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("zip", "enumerate") \
            and isinstance(target, (ast.Tuple, ast.List)):
        sources = it.args if it.func.id == "zip" else [None, *it.args[:1]]  # enumerate: (index, element)
        for t, src in zip(target.elts, sources):
            if src is not None:
                yield from _bound(t, src, rooted)
        return
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr in ("values", "items") \
            and not it.args:
        if it.func.attr == "items":  # (key, value): the value is the element
            if isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2:
                yield from _bound(target.elts[1], it.func.value, rooted)
            return
        it = it.func.value
    if isinstance(target, ast.Name) and _plain_container(it) and rooted(it):
        yield target.id


def _plain_container(it) -> bool:
    """`x.attr`, `x.attr[k]`: the stored object itself, iterated (not a copy or a computed sequence)."""
    while isinstance(it, ast.Subscript):
        if isinstance(it.slice, ast.Slice):
            return False  # a slice is a new list; its elements are still the same objects, but keep it narrow
        it = it.value
    return isinstance(it, (ast.Attribute, ast.Name))
