"""Checks that raise, spelled without an `if`: `assert self.pos < MAXLEN` and torch's compile-era
`torch._check(self.pos < self.max_len, lambda: ...)` (also `_check_index`, `_check_value`, `_check_type`,
`_check_not_implemented`, and `_check_with(Err, cond, msg)`).

Each is `if not cond: raise` in one statement. On a host counter the step advances (or prepare() stages) it holds
in every audited step and fails on a later one, and a graph never runs it: the bounds check a replay skips, which
counter_branches reports for the `if` form. The check is handed to it as that `if`: the condition as the test
(whether it turns does not depend on its sign), a `raise` no line ran as the body, placed at the check's line.
"""

from __future__ import annotations

import ast

from audit.scan.sources.ast_nodes import nodes_of

_CHECKS = {"_check": 0, "_check_index": 0, "_check_value": 0, "_check_type": 0, "_check_not_implemented": 0,
           "_check_with": 1}  # torch's check functions -> the position of the condition


def _condition(n: ast.AST) -> ast.AST | None:
    """The condition of an `assert` or of a call of torch's check functions (`torch._check(cond, msg)`)."""
    if isinstance(n, ast.Assert):
        return n.test
    if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Attribute) or n.func.attr not in _CHECKS:
        return None
    if not (isinstance(n.func.value, ast.Name) and n.func.value.id == "torch"):
        return None
    i = _CHECKS[n.func.attr]
    return n.args[i] if len(n.args) > i else next((k.value for k in n.keywords if k.arg == "cond"), None)


def as_ifs(func) -> list:
    """Each raising check of `func` as an `if cond: raise` (a body no line ran) at the check's line."""
    out = []
    for n in nodes_of(func, (ast.Assert, ast.Call)):
        cond = _condition(n)
        if cond is None:
            continue
        node = ast.If(test=cond, body=[ast.Raise(exc=None, cause=None, lineno=0, col_offset=0, end_lineno=0,
                                                 end_col_offset=0)], orelse=[])
        out.append(ast.copy_location(node, n))
    return out
