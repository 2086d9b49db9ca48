"""Generators the target registers with the CUDA graph it captures: a draw on them is captured, not refused.

A CUDA generator other than the default one raises under capture unless the graph knows it
(`graph.register_generator_state(gen)`, torch >= 2.4); registered, each replay advances its philox offset as the
default generator's does. The registration is written where the target captures (a runner's `capture()`, which
a scan never runs), so it is read from the source: the `generator=` expression of the draw (`self.gen`, followed
out through a parameter of the same name to the caller's keyword: a sampler helper taking `generator=`) names
the generator by its last name, and a `register_generator_state(...)` call in the target's own files, or in a
file on the draw's stack, whose argument ends in the same name (`self.sampler.gen`) registers it.
"""

from __future__ import annotations

import ast

from audit.detectors._source import enclosing_function, tree
from audit.scan.ast_nodes import calls_at, nodes_of


def _last(expr) -> str | None:
    return expr.attr if isinstance(expr, ast.Attribute) else expr.id if isinstance(expr, ast.Name) else None


def registrations(files) -> dict[str, tuple[str, int]]:
    """last name -> (file, line) of each `X.register_generator_state(gen)` call in the files."""
    out: dict[str, tuple[str, int]] = {}
    for f in sorted(set(files)):
        t = tree(f)
        for c in nodes_of(t, ast.Call) if t is not None else ():
            if isinstance(c.func, ast.Attribute) and c.func.attr == "register_generator_state" and c.args:
                name = _last(c.args[0])
                if name is not None:
                    out.setdefault(name, (f, c.lineno))
    return out


def _keyword(filename: str, line: int, key: str):
    t = tree(filename)
    for c in calls_at(t, line) if t is not None else ():
        for k in c.keywords:
            if k.arg == key:
                return k.value
    return None


def _params(func) -> set:
    a = getattr(func, "args", None)
    return {x.arg for x in (a.posonlyargs + a.args + a.kwonlyargs)} if a is not None else set()


def drawn_from(stack) -> str | None:
    """The last name of the generator the innermost frame's draw passes (`generator=self.gen` -> "gen"),
    followed out through a parameter to the caller's keyword of that name; None when not written there."""
    key = "generator"
    for code, line in reversed(stack):
        expr = _keyword(code.co_filename, line, key)
        if expr is None:
            return None
        if isinstance(expr, ast.Name) and expr.id in _params(enclosing_function(code.co_filename, line)):
            key = expr.id
            continue
        return _last(expr)
    return None


def registered(ctx, rec) -> tuple[str, str, int] | None:
    """(name, file, line) of the registration of the generator `rec` draws from, or None."""
    if not rec.stack:
        return None
    name = drawn_from(rec.stack)
    if name is None:
        return None
    files = list(ctx.own_files()) + [code.co_filename for code, _ in rec.stack]
    hit = registrations(files).get(name)
    return None if hit is None else (name, *hit)
