"""Generators the target registers with the CUDA graph it captures: a draw on them is captured, not refused.

A CUDA generator other than the default one raises under capture unless the graph knows it
(`graph.register_generator_state(gen)`, torch >= 2.4); registered, each replay advances its philox offset as the
default generator's does. The registration is written where the target captures (a runner's `capture()`, which
a scan never runs), so it is read from the source: the `generator=` expression of the draw (`self.gen`, followed
out through a parameter of the same name to the caller's keyword: a sampler helper taking `generator=`) names
the generator by its last name, and a `register_generator_state(...)` call in the target's own files, or in a
file on the draw's stack, whose argument ends in the same name (`self.sampler.gen`) registers it, unless both name
generator objects on the traced target and they differ (a runner's `self.gen` beside a noise helper's own
`self.gen`: the helper's draw stays unregistered). A generator
handed to another object under another name (`DDPMStep(..., self.gen)` keeping it as `self.generator`) is matched
by the object itself: both expressions, rooted at `self`, are followed on the traced objects whose class defines
the function they are written in. One of a container's generators (`self.gens[b]`, registered in a loop over
`self.gens`) is matched by that container (generator_elements.py).
"""

from __future__ import annotations

import ast

import torch

from audit.detectors.source.lookup import enclosing_function, tree
from audit.detectors.state.generator_elements import container_of, registered_element, values_at
from audit.scan.sources.ast_nodes import calls_at, nodes_of


def _last(expr) -> str | None:
    return expr.attr if isinstance(expr, ast.Attribute) else expr.id if isinstance(expr, ast.Name) else None


def _calls(files) -> list[tuple[str, int, ast.expr]]:
    """[(file, line, argument)] of the `X.register_generator_state(gen)` calls in the files."""
    out = []
    for f in sorted(set(files)):
        t = tree(f)
        for c in nodes_of(t, ast.Call) if t is not None else ():
            if isinstance(c.func, ast.Attribute) and c.func.attr == "register_generator_state" and c.args:
                out.append((f, c.lineno, c.args[0]))
    return out


def registrations(files) -> dict[str, list[tuple[str, int, ast.expr]]]:
    """last name -> [(file, line, argument)] of the `X.register_generator_state(gen)` calls in the files."""
    out: dict[str, list] = {}
    for f, line, arg in _calls(files):
        name = _last(arg)
        if name is not None:
            out.setdefault(name, []).append((f, line, arg))
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


def _drawn_expr(stack):
    """(code, line, expression) of the generator the innermost frame's draw passes (`generator=self.gen`),
    followed out through a parameter to the caller's keyword of that name; None when not written there."""
    key = "generator"
    for code, line in reversed(stack):
        expr = _keyword(code.co_filename, line, key)
        if expr is None:
            return None
        if isinstance(expr, ast.Name) and expr.id in _params(enclosing_function(code.co_filename, line)):
            key = expr.id
            continue
        return code, line, expr
    return None


def drawn_from(stack) -> str | None:
    """The last name of the generator the draw passes (`generator=self.gen` -> "gen"), or None."""
    found = _drawn_expr(stack)
    return None if found is None else _last(found[2])


def _generators(ctx, filename: str, line: int, expr) -> list:
    """The generator objects `expr` (an attribute chain on the first parameter of the function holding `line`)
    names on the traced objects whose class defines that function, read without running code."""
    return [v for v in values_at(ctx, filename, line, expr) if isinstance(v, torch.Generator)]


def _by_object(ctx, stack, files) -> tuple[str, str, int] | None:
    """The registration whose argument is the very generator object the draw's `generator=` names."""
    found = _drawn_expr(stack)
    drawn = {id(g) for g in _generators(ctx, found[0].co_filename, found[1], found[2])} if found else set()
    for f in sorted(set(files)) if drawn else ():
        t = tree(f)
        for c in nodes_of(t, ast.Call) if t is not None else ():
            if isinstance(c.func, ast.Attribute) and c.func.attr == "register_generator_state" and c.args and \
                    any(id(g) in drawn for g in _generators(ctx, f, c.lineno, c.args[0])):
                return _last(c.args[0]) or "generator", f, c.lineno
    return None


def registered(ctx, rec) -> tuple[str, str, int] | None:
    """(name, file, line) of the registration of the generator `rec` draws from, or None."""
    if not rec.stack:
        return None
    found = _drawn_expr(rec.stack)
    name = None if found is None else _last(found[2])
    files = list(ctx.own_files()) + [code.co_filename for code, _ in rec.stack]
    drawn = {id(g) for g in _generators(ctx, found[0].co_filename, found[1], found[2])} if found else set()
    if found is not None and container_of(found[0].co_filename, found[1], found[2]) is not None:
        name = None  # an element of a container (`self.gens[b]`, a loop's `gen`): matched by its container below
    for f, line, arg in registrations(files).get(name, []) if name is not None else ():
        if container_of(f, line, arg) is not None:
            continue  # a loop variable's name says nothing of which generators it registers
        # the same last name is trusted unless both sides resolve to generator objects and differ: a runner
        # registering its sampling `self.gen` says nothing of a noise helper's own `self.gen`
        regd = _generators(ctx, f, line, arg) if drawn else []
        if not regd or any(id(g) in drawn for g in regd):
            return name, f, line
    # one generator per request in a list or dict (`generator=self.gens[b]`, registered in a loop over them)
    element = registered_element(ctx, found, _calls(files)) if found is not None else None
    return element or _by_object(ctx, rec.stack, files)
