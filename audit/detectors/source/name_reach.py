"""Which functions a step can reach by name, read from the source rather than from the frames that ran.

A hazard written between steps (a timer callback, a worker thread, a setter the step never calls this
time) has no frame in the trace. What decides whether the step's own code leads there is the names its
bodies call or read as attributes, followed through the functions of those names in the same files.
The walk is by name only: it over-approximates reach, which is the safe side for rules that excuse a
site the step cannot get to.
"""

from __future__ import annotations

import ast

from audit.detectors.source.lookup import def_first_line, tree
from audit.scan.sources.ast_nodes import all_nodes

__all__ = ["defs_by_name", "names_used", "reached_from", "reached_names"]


def defs_by_name(filename: str) -> dict:
    """Every function and method defined in a file, by name (a name may be defined more than once)."""
    t = tree(filename)
    out: dict = {}
    for n in all_nodes(t) if t is not None else ():
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(n.name, []).append(n)
    return out


def names_used(node) -> set:
    """Names a function's body calls or reads as an attribute (`self._advance()`, `self.current_sigma`)."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            out.add(n.func.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def reached_names(start: set, defs: dict) -> set:
    """The names reachable from `start` through the bodies of the functions `defs` holds by name."""
    names, todo = set(), list(start)
    while todo:
        n = todo.pop()
        if n in names:
            continue
        names.add(n)
        for d in defs.get(n, ()):
            todo.extend(names_used(d))
    return names


def reached_from(codes, files: set, skip=()) -> set:
    """The names the running functions `codes` reach by name, followed through their files and `files`, those
    functions' own names included; definitions named in `skip` are not followed."""
    defs: dict = {}
    for f in set(files) | {c.co_filename for c in codes}:
        for k, v in defs_by_name(f).items():
            defs.setdefault(k, []).extend(v)
    start = set()
    for c in codes:
        start.add(c.co_name)
        for d in defs_by_name(c.co_filename).get(c.co_name, ()):
            if def_first_line(d) <= c.co_firstlineno <= d.body[0].lineno:
                start |= names_used(d)
    return reached_names(start, {k: v for k, v in defs.items() if k not in skip})
