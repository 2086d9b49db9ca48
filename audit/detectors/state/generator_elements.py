"""Generators named as elements of a container: one per request or batch slot (`self.gens[b]`).

A sampler that seeds each request's draws keeps a list (or dict) of generators and draws row `b` with
`generator=self.gens[b]`, or with a loop variable (`for gen in self.gens:`); the runner that captures the step
registers them all the same way (`for gen in self.gens: graph.register_generator_state(gen)`). Neither side
names the generator by an attribute of its own, so the two are matched by the container whose elements they
name: a subscript's value, or the iterable of the enclosing `for` or comprehension that binds the name
(through `enumerate(...)`, `zip(...)` and `.values()`). When both containers resolve to objects on the traced
target (attribute chains rooted at `self`), they must share a generator: a helper's own `self.gens` is not the
runner's.
"""

from __future__ import annotations

import ast
import inspect

import torch

from audit.detectors.source.lookup import enclosing_function, tree
from audit.detectors.state.sites import objects_defining
from audit.scan.sources.ast_nodes import attr_chain

_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def values_at(ctx, filename: str, line: int, expr) -> list:
    """The values `expr` (an attribute chain on the first parameter of the function holding `line`) names on the
    traced objects whose class defines that function, read without running code."""
    chain, func = attr_chain(expr), enclosing_function(filename, line)
    args = getattr(getattr(func, "args", None), "args", None)
    if not chain or len(chain) < 2 or not args or chain[0] != args[0].arg:
        return []
    first = min([func.lineno] + [d.lineno for d in func.decorator_list])
    out = []
    for _, obj in objects_defining(ctx, filename, first, func.name):
        v = obj
        for name in chain[1:]:
            try:
                v = inspect.getattr_static(v, name)
            except AttributeError:
                break
        else:
            out.append(v)
    return out


def _binds(target, name: str) -> int | None:
    """Position of `name` in a for target (`gen` -> 0, `(b, gen)` -> 1), None when it does not bind it."""
    if isinstance(target, ast.Name):
        return 0 if target.id == name else None
    if isinstance(target, (ast.Tuple, ast.List)):
        for i, t in enumerate(target.elts):
            if isinstance(t, ast.Name) and t.id == name:
                return i
    return None


def _iterable(it, target, name: str):
    """The container a loop over `it` takes `name` from: `enumerate(c)` and `.values()` unwrapped, `zip(a, c)` by
    the name's position in the target."""
    pos = _binds(target, name)
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.args:
        if it.func.id == "enumerate" and isinstance(target, (ast.Tuple, ast.List)) and pos == 1:
            return _iterable(it.args[0], ast.Name(id=name), name)
        if it.func.id == "zip" and isinstance(target, (ast.Tuple, ast.List)) and pos is not None and pos < len(it.args):
            return _iterable(it.args[pos], ast.Name(id=name), name)
        return None
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "values" and not it.args:
        return it.func.value
    return it if isinstance(target, ast.Name) else None


def container_of(filename: str, line: int, expr):
    """The container expression whose element `expr` (written at `line`) is: `self.gens` for `self.gens[b]`, or
    for a name the iterable of the innermost enclosing `for` / comprehension binding it; None otherwise."""
    if isinstance(expr, ast.Subscript):
        return expr.value
    if not isinstance(expr, ast.Name):
        return None
    scope = enclosing_function(filename, line) or tree(filename)
    best = None
    for node in ast.walk(scope) if scope is not None else ():
        if not (getattr(node, "lineno", None) and node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        loops = [(node.target, node.iter)] if isinstance(node, (ast.For, ast.AsyncFor)) else \
            [(g.target, g.iter) for g in node.generators] if isinstance(node, _COMPS) else []
        for target, it in loops:
            if _binds(target, expr.id) is not None and (best is None or node.lineno >= best[0]):
                best = (node.lineno, _iterable(it, target, expr.id))
    return None if best is None else best[1]


def _last(expr) -> str | None:
    return expr.attr if isinstance(expr, ast.Attribute) else expr.id if isinstance(expr, ast.Name) else None


def _members(ctx, filename: str, line: int, container) -> set:
    """ids of the generators a container expression holds on the traced objects (a list, tuple or dict of them)."""
    out = set()
    for v in values_at(ctx, filename, line, container):
        items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else ()
        out |= {id(g) for g in items if isinstance(g, torch.Generator)}
    return out


def registered_element(ctx, drawn, registrations) -> tuple[str, str, int] | None:
    """(name, file, line) of a registration naming an element of the container the draw's generator is an
    element of. `drawn` is (code, line, expression) of the draw's `generator=`; `registrations` is
    [(file, line, argument)] of every register_generator_state call."""
    code, line, expr = drawn
    mine = container_of(code.co_filename, line, expr)
    name = _last(mine) if mine is not None else None
    if name is None:
        return None
    held = _members(ctx, code.co_filename, line, mine)
    for f, reg_line, arg in registrations:
        theirs = container_of(f, reg_line, arg)
        if theirs is None or _last(theirs) != name:
            continue
        regd = _members(ctx, f, reg_line, theirs) if held else set()
        if not regd or held & regd:
            return name, f, reg_line
    return None
