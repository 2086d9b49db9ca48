"""Clamps that pick, spelled without an `if`: `max(1.0, self.seq_len / ORIG)`, `min(self.pos + 1, WINDOW)`.

The builtin `min`/`max` of two numbers is `a if a < b else b` in one call: the host decides which operand the
value comes from. On a host length that stays within the trained context for the audited steps the clamp keeps
returning the same constant, so no op's argument moves and nothing looks baked; once the length passes it, eager
decoding takes the other operand while a graph keeps the captured value (a dynamic NTK or logit scale that starts
at the context length). The clamp is handed to counter_branches as that conditional expression, at the call's
line, so it is run forward on the counter's stride like any other test on a counter.
"""

from __future__ import annotations

import ast

from audit.scan.sources.ast_nodes import nodes_of


def _pair(n: ast.AST):
    """The two operands of a builtin `min(a, b)` / `max(a, b)` call, else None (one iterable, a `key=`, `*args`)."""
    if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("min", "max")):
        return None
    if len(n.args) != 2 or n.keywords or any(isinstance(a, ast.Starred) for a in n.args):
        return None
    return n.args


def as_ifexps(func) -> list:
    """Each two-operand `min`/`max` call of `func` as the conditional expression it is, at the call's line."""
    out = []
    for n in nodes_of(func, ast.Call):
        pair = _pair(n)
        if pair is None:
            continue
        a, b = pair
        test = ast.copy_location(ast.Compare(left=a, ops=[ast.Lt()], comparators=[b]), n)
        out.append(ast.copy_location(ast.IfExp(test=test, body=a, orelse=b), n))
    return out
