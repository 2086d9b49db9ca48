"""The device branches of a function, as `if` nodes: what the CPU-scan rules read on either side of them.

Besides plain `if` statements: a guard that returns early with no `else` (`if not x.is_cuda: return
fallback(x)`) has the statements after it as its other side; a conditional expression counts as an `if`
whose sides are its two values; an `and` outside an `if` test as an `if` with that test and no sides.
"""

from __future__ import annotations

import ast

__all__ = ["guards"]


def guards(func):
    """Every device branch of `func` as an `if` node (a conditional expression's has `expr` set)."""
    tests = {id(n.test) for n in ast.walk(func) if isinstance(n, ast.If)}  # a `while` test's `and` is one too
    for node in ast.walk(func):
        if isinstance(node, ast.IfExp):
            sides = [ast.copy_location(ast.Expr(v), v) for v in (node.body, node.orelse)]
            guard = ast.copy_location(ast.If(test=node.test, body=sides[:1], orelse=sides[1:]), node)
            guard.expr = True
            yield guard
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And) and id(node) not in tests:
            yield ast.copy_location(ast.If(test=node, body=[], orelse=[]), node)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for i, st in enumerate(block):
                if not isinstance(st, ast.If):
                    continue
                if not st.orelse and st.body and isinstance(st.body[-1], (ast.Return, ast.Raise)) and block[i + 1:]:
                    yield ast.copy_location(ast.If(test=st.test, body=st.body, orelse=block[i + 1:]), st)
                else:
                    yield st
