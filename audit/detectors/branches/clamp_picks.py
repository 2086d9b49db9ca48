"""Clamps that pick, spelled without an `if`: `max(1.0, self.seq_len / ORIG)`, `min(self.pos + 1, WINDOW)`.

The builtin `min`/`max` of two numbers is `a if a < b else b` (`max`: `a > b`) in one call: the host decides which operand the
value comes from. On a host length that stays within the trained context for the audited steps the clamp keeps
returning the same constant, so no op's argument moves and nothing looks baked; once the length passes it, eager
decoding takes the other operand while a graph keeps the captured value (a dynamic NTK or logit scale that starts
at the context length). The clamp is handed to counter_branches as that conditional expression, at the call's
line, so it is run forward on the counter's stride like any other test on a counter. A clamp with a tensor's size
among its operands (`topk(min(self.k, s.size(0)))` over a slice that grows) follows that shape: the dynamic
shape upstream is the finding, and a static shape fixes both, so it is not read as a pick.
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


_SIZE_CALLS = ("size", "numel", "dim", "len")


def _reads_size(e) -> bool:
    """The expression reads a tensor's size: `.shape`, `.size()`, `.numel()`, `.dim()`, `len(...)`."""
    for n in ast.walk(e):
        if isinstance(n, ast.Attribute) and n.attr in ("shape", "ndim"):
            return True
        if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) in _SIZE_CALLS:
            return True
    return False


def as_ifexps(func) -> list:
    """Each two-operand `min`/`max` call of `func` as the conditional expression it is, at the call's line."""
    out = []
    for n in nodes_of(func, ast.Call):
        pair = _pair(n)
        if pair is None or any(map(_reads_size, pair)):
            continue
        a, b = pair
        op = ast.Lt() if n.func.id == "min" else ast.Gt()  # min: a if a < b else b; max: a if a > b else b
        test = ast.copy_location(ast.Compare(left=a, ops=[op], comparators=[b]), n)
        node = ast.copy_location(ast.IfExp(test=test, body=a, orelse=b), n)
        node.clamp = True
        out.append(node)
    return out


def picks_moving(node, found, value, reads) -> bool:
    """Whether a clamp read by `as_ifexps` returned its moving operand in the last audited step: `found` is the
    test compiled over the counter (`counter_tests.compiled`), `value` the counter's last value, `reads` which
    counters an expression reads. Then the value the ops take moved with it (`min(self.pos + 1, W)` while the
    position is below W), and a running extreme (`self.lo = min(self.lo, v)`) moves with its data: the baked value
    downstream is the finding, not the clamp. Where the test cannot be evaluated, the clamp stays reported."""
    if not getattr(node, "clamp", False):
        return False

    def fixed(e):  # an operand that reads no counter and no data: the constant a clamp holds to
        return not reads(e) and not any(isinstance(x, ast.Call) for x in ast.walk(e))
    if not (fixed(node.body) or fixed(node.orelse)):
        return True  # both operands move (a running extreme of data values): no constant side to stay on
    if found is None:
        return False
    code, env = found
    try:
        took = bool(eval(code, {"__builtins__": {}}, {**(value if isinstance(value, dict) else {"_c": value}), **env}))
    except Exception:  # noqa: BLE001 - not evaluable: keep the finding
        return False
    return not fixed(node.body if took else node.orelse)
