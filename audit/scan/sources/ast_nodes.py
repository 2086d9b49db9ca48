"""Flat views of a parsed source file, computed once per parsed tree.

Detectors ask the same file the same questions once per traced op (which calls span this line, which
def holds it); walking the tree with `ast.walk` each time was most of a scan's time on a model of a few
thousand ops (the tiny DeepSeek-V4 step: 15 of 18 s). A view is keyed by the tree object itself, and
a file edited on disk is parsed into a new tree, so views never go stale. Trees are never mutated.
"""

from __future__ import annotations

import ast
import functools

__all__ = ["all_nodes", "attr_chain", "calls_at", "nodes_of"]


@functools.lru_cache(maxsize=1024)
def all_nodes(t: ast.AST) -> tuple:
    """Every node under t (t included), in `ast.walk`'s order."""
    return tuple(ast.walk(t))


@functools.lru_cache(maxsize=2048)
def nodes_of(t: ast.AST, kinds) -> tuple:
    """The nodes under t that are instances of `kinds` (a type or a tuple of types), in walk order."""
    return tuple(n for n in all_nodes(t) if isinstance(n, kinds))


@functools.lru_cache(maxsize=512)
def _calls_by_line(t: ast.AST) -> dict:
    index: dict[int, list] = {}
    for n in nodes_of(t, ast.Call):
        for line in range(n.lineno, (n.end_lineno or n.lineno) + 1):
            index.setdefault(line, []).append(n)
    return index


def calls_at(t: ast.AST, line: int) -> list:
    """The calls under t whose source spans `line`, in walk order (outer calls before the calls in their
    arguments)."""
    return list(_calls_by_line(t).get(line, ()))


def attr_chain(expr) -> list[str] | None:
    """`self.sampler.gen` -> ["self", "sampler", "gen"]; None for anything but a name's attribute chain."""
    names = []
    while isinstance(expr, ast.Attribute):
        names.append(expr.attr)
        expr = expr.value
    return [expr.id, *reversed(names)] if isinstance(expr, ast.Name) else None
