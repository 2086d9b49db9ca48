"""Code a boolean chain runs on the CPU only: what follows a device test that short-circuits it on a GPU.

`if not compiling() and empty.device.type == "cpu" and empty.any(): warn(...)` (sentence-transformers' maxsim
warning about empty documents): on a GPU the device test is False, `and` stops there, and neither `empty.any()`
nor the warning runs; a CPU scan runs both and traces the read. Likewise `x.is_cuda or int(x.max()) > 0`, and an
`if` whose `and` test holds a conjunct false on CUDA (its body) or whose `or` test holds a disjunct true on CUDA
(its other side). Only a test the device settles counts (device/cuda_side.py, per operand), and the rest of the
statement on the finding's line (the operands before it, what the chain's value feeds) may call nothing but
argument-less functions (`is_torchdynamo_compiling()`): it runs on a GPU too, and a read there would share the line.
"""

from __future__ import annotations

import ast

from audit.detectors.device.cuda_side import cuda_side

__all__ = ["cpu_only_test"]


def _stops_on_cuda(operand, op, resolve, file) -> bool:
    """The operand ends the chain on CUDA and lets it go on on the CPU."""
    side = cuda_side(operand, resolve, file=file)
    return side == ("orelse" if isinstance(op, ast.And) else "body")


def _quiet(nodes, line: int, skip=frozenset()) -> bool:
    """No call on `line` in `nodes` (outside the subtrees `skip`) that could read a tensor (a call with arguments,
    or a method of an object)."""
    for n in _walk(nodes, skip):
        if isinstance(n, ast.Call) and n.lineno <= line <= (n.end_lineno or n.lineno):
            if n.args or n.keywords or not (isinstance(n.func, ast.Name) or ast.unparse(n.func).startswith("torch.")):
                return False
    return True


def _walk(nodes, skip):
    todo = list(nodes)
    while todo:
        n = todo.pop()
        if id(n) in skip:
            continue
        yield n
        todo.extend(ast.iter_child_nodes(n))


def _statement(func, node):
    """The innermost statement of `func` holding `node`."""
    best = None
    for st in ast.walk(func):
        if isinstance(st, ast.stmt) and st is not func and any(x is node for x in ast.walk(st)):
            best = st if best is None or st.lineno >= best.lineno else best
    return best


def _holds(nodes, line: int) -> bool:
    return any(n.lineno <= line <= (n.end_lineno or n.lineno) for n in nodes)


def cpu_only_test(func, line: int, resolve, file: str):
    """(device test text, its line) when `line` of `func` runs only on the CPU's side of a short-circuiting
    boolean chain (an operand after the test, or the side of an `if` that needs the chain to go on), else None.
    `resolve(expr)`: the assignments of a name, as cuda_side reads them."""
    for chain in (n for n in ast.walk(func) if isinstance(n, ast.BoolOp)):
        for i, operand in enumerate(chain.values[:-1]):
            if not _stops_on_cuda(operand, chain.op, resolve, file):
                continue
            later = chain.values[i + 1:]
            st = _statement(func, chain) if _holds(later, line) else None
            if st is not None and _quiet([st], line, {id(v) for v in later}):
                return ast.unparse(operand), operand.lineno
    for g in (n for n in ast.walk(func) if isinstance(n, (ast.If, ast.While, ast.IfExp))):
        test = g.test
        if not isinstance(test, ast.BoolOp):
            continue
        side = g.body if isinstance(test.op, ast.And) else g.orelse
        side = side if isinstance(side, list) else [side]
        if not _holds(side, line) or _holds([test], line):
            continue
        for operand in test.values:
            if _stops_on_cuda(operand, test.op, resolve, file):
                return ast.unparse(operand), operand.lineno
    return None
