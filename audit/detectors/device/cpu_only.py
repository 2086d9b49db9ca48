"""Lines a GPU never runs: the CPU's side of a device branch, for what a CPU scan traced there.

`if x.is_cuda: return kernel(x)` followed by a reference path with `int(lens.max())`: a CPU scan runs
the reference and traces its read, yet on a GPU the kernel runs instead and the read never happens. A
traced finding whose stack passes through such a side (one the test itself settles: cuda_side.py) stays in
the inventory as info, naming the test, not as a hazard of the GPU step. A conditional expression's sides
share their line with the rest of the statement: only a statement that is the expression alone, with a
GPU side that calls nothing, is read. What a boolean chain evaluates after a device test that stops it on a
GPU (`empty.device.type == "cpu" and empty.any()`) is the CPU's too (short_circuits.py).
"""

from __future__ import annotations

import ast
import functools

from audit.detectors.source import lookup, scopes
from audit.detectors.device.cuda_side import cuda_side
from audit.detectors.device.device_branches import guards
from audit.detectors.device.short_circuits import cpu_only_test
from audit.scan.standins.cpu_kernels import KERNELS as CPU_KERNELS

__all__ = ["cpu_side"]


def _holds(stmts, line: int) -> bool:
    return any(st.lineno <= line <= (st.end_lineno or st.lineno) for st in stmts)


@functools.lru_cache(maxsize=4096)
def _at(file: str, line: int):
    """(test text, test line) of the device branch whose CPU-only side holds `line`, else None."""
    tree = lookup.tree(file)
    func = lookup.enclosing_function(file, line) if tree is not None else None
    if func is None or func is tree:
        return None
    for g in guards(func):
        if getattr(g, "expr", False) or not (_holds(g.body, line) or _holds(g.orelse, line)):
            continue
        side = cuda_side(g.test, lambda e, n=g.lineno: scopes.values(tree, e, n), file=file)
        cpu = g.orelse if side == "body" else g.body if side == "orelse" else ()
        if _holds(cpu, line):
            return ast.unparse(g.test), g.lineno
    return _whole_expression(tree, func, line, file) or \
        cpu_only_test(func, line, lambda e: scopes.values(tree, e, line), file)


def _whole_expression(tree, func, line: int, file: str):
    """A statement that is one conditional expression (`n = cap if x.is_cuda else int(lens.max())`, a
    return, a call's value) whose test and GPU side run no call: every op on its lines is the CPU side's."""
    for st in ast.walk(func):
        v = getattr(st, "value", None)
        if not (isinstance(st, (ast.Assign, ast.AnnAssign, ast.Return, ast.Expr)) and isinstance(v, ast.IfExp)
                and _holds([st], line)):
            continue
        if isinstance(st, (ast.Assign, ast.AnnAssign)) and not all(
                isinstance(t, ast.Name) for t in (st.targets if isinstance(st, ast.Assign) else [st.target])):
            continue  # a subscript or attribute target runs code of its own
        side = cuda_side(v.test, lambda e, n=st.lineno: scopes.values(tree, e, n), file=file)
        gpu = v.body if side == "body" else v.orelse if side == "orelse" else None
        if gpu is not None and not any(isinstance(n, ast.Call) for part in (v.test, gpu) for n in ast.walk(part)):
            return ast.unparse(v.test), v.lineno
    return None


def cpu_side(stack):
    """(file, what a GPU does instead, line) for the innermost frame of `stack` that runs on a CPU-only side:
    the other side of a device test, or another kernel of a custom op (audit/scan/standins/cpu_kernels.py)."""
    for code, line in reversed(stack):
        if (kernel := CPU_KERNELS.get((code.co_filename, code.co_firstlineno))) is not None:
            return code.co_filename, f"a GPU does not run {kernel}", code.co_firstlineno
        hit = _at(code.co_filename, line)
        if hit is not None:
            return code.co_filename, f"a GPU takes the other side of `{hit[0]}`", hit[1]
    return None
