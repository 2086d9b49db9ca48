"""Which code a CUDA graph capture never runs: reads and bookkeeping that stall eager decode only.

`if not torch.cuda.is_current_stream_capturing(): sync()` is the plain form. Libraries wrap the test in a
helper that answers True for any kind of tracing (transformers' `is_tracing(t)`: `compiling() or jit_tracing()
or is_cuda_stream_capturing()`, the last one calling torch's test), and place the read right in the test
(`if not is_tracing(mask) and mask.all():`, short-circuited while capturing) or after an early exit
(`if is_tracing(mask): return False`, then `fast_all(mask)`). A call counts as the capture test when it is
torch's, or a function it resolves to (in the calling file's module) whose every return outside an `except`
is true whenever a capture is: the test itself, an `or` holding one, an `and` of one with availability checks
(`return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()`), or a local first bound from one
(`_is_tracing = a() or capturing(); _is_tracing |= b(); return _is_tracing`), followed a few helpers down;
a constant true return beside them (`if torch.compiler.is_compiling(): return True`) is true then as well.
A test may hold the capture test behind a presence check of the tensor it asks about (transformers 5.25:
`if exporting() or (mask is not None and is_tracing(mask)): return False`, then `fast_all(mask)`): for a line
that reads that name, the name is present whenever the line runs, so the conjunct is true while capturing. So is
an availability check code that also runs on CPU-only machines puts first (`torch.cuda.is_available() and CAP`):
a graph is only captured with CUDA up.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect

from audit.detectors.state import handoff
from audit.detectors.source.lookup import chain, enclosing_function, tree

DEPTH = 3  # helpers of helpers followed for a capture test


def _torch_test(n: ast.AST) -> bool:
    return isinstance(n, ast.Call) and ast.unparse(n.func).endswith("is_current_stream_capturing")


def capturing(n: ast.AST, file: str | None = None, depth: int = 0) -> bool:
    """`n` is a call that returns True while a graph is being captured."""
    if _torch_test(n):
        return True
    if not isinstance(n, ast.Call) or file is None or depth >= DEPTH:
        return False
    obj = handoff.resolve(file, n.func)
    code = None
    with contextlib.suppress(Exception):
        code = inspect.unwrap(obj).__code__
    return code is not None and _predicate(code.co_filename, code.co_firstlineno, code.co_name, depth + 1)


@functools.lru_cache(maxsize=1024)
def _predicate(file: str, first: int, name: str, depth: int) -> bool:
    """The function defined at `first` of `file` returns a true value whenever a capture is in progress."""
    func = enclosing_function(file, first + 1)
    if func is None or getattr(func, "name", None) != name:
        return False
    handlers = {id(s) for h in ast.walk(func) if isinstance(h, ast.ExceptHandler) for s in ast.walk(h)}
    returns = [r for r in ast.walk(func) if isinstance(r, ast.Return) and id(r) not in handlers]
    bound = {t.id: node.value for node in ast.walk(func) if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(func):  # `x |= y` keeps a true x true; any other update may not
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and not isinstance(node.op, ast.BitOr):
            bound.pop(node.target.id, None)

    def holds(e, seen=()) -> bool:
        if isinstance(e, ast.BoolOp) and isinstance(e.op, ast.Or):
            return any(holds(v, seen) for v in e.values)
        if isinstance(e, ast.BoolOp):  # `return torch.cuda.is_available() and CAP`: CUDA is up while capturing
            caps = [v for v in e.values if not _cuda_up(v)]
            return bool(caps) and all(holds(v, seen) for v in caps)
        if isinstance(e, ast.Name) and e.id in bound and e.id not in seen:
            return holds(bound[e.id], seen + (e.id,))
        return capturing(e, file, depth)
    # an early `return True` (`if torch.compiler.is_compiling(): return True`) is true while capturing too; the
    # function still needs one return that is the capture test itself
    tested = [r for r in returns if not _constant_true(r.value)]
    return bool(tested) and all(r.value is not None and holds(r.value) for r in tested)


def _constant_true(e) -> bool:
    return isinstance(e, ast.Constant) and bool(e.value)


def _present(n, given) -> bool:
    """`NAME is not None` for a name the guarded line reads (`given`): true whenever that line runs; likewise
    `isinstance(NAME, torch.Tensor)`: the line can only read a tensor back through NAME when it is one
    (transformers 5.25: `if isinstance(q_offset, torch.Tensor) and is_tracing(q_offset): return False`, then
    `q_offset == 0` in a test)."""
    if isinstance(n, ast.Call) and ast.unparse(n.func) == "isinstance" and len(n.args) == 2:
        kind = n.args[1]
        return isinstance(n.args[0], ast.Name) and n.args[0].id in given \
            and isinstance(kind, (ast.Name, ast.Attribute)) and ast.unparse(kind).endswith("Tensor")
    return isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], ast.IsNot) \
        and isinstance(n.left, ast.Name) and n.left.id in given \
        and isinstance(n.comparators[0], ast.Constant) and n.comparators[0].value is None


def _true_capturing(n, file, given=frozenset()) -> bool:
    """`n` is true while a graph is captured: the capture test, an `or` holding one, an `and` of one with
    presence checks of names the guarded line reads (`mask is not None and is_tracing(mask)`)."""
    if isinstance(n, ast.BoolOp) and isinstance(n.op, ast.Or):
        return any(_true_capturing(v, file, given) for v in n.values)
    if isinstance(n, ast.BoolOp):
        caps = [v for v in n.values if not _present(v, given) and not _cuda_up(v)]
        return bool(caps) and all(_true_capturing(v, file, given) for v in caps)
    return capturing(n, file)


def _cuda_up(n) -> bool:
    """`torch.cuda.is_available()` / `is_initialized()`: true whenever a CUDA graph is being captured, so an `and`
    of it with the capture test (code that also runs on CPU-only machines) is still the capture test."""
    return isinstance(n, ast.Call) and not n.args and not n.keywords \
        and ast.unparse(n.func).endswith(("cuda.is_available", "cuda.is_initialized"))


def _false_capturing(n, file, given=frozenset()) -> bool:
    """`n` is false while a graph is captured: `not CAP`, `not torch.cuda.is_available()`, an `and` holding
    one, an `or` of them only (`not torch.cuda.is_available() or not capturing()`)."""
    if isinstance(n, ast.BoolOp):
        parts = [_false_capturing(v, file, given) for v in n.values]
        return any(parts) if isinstance(n.op, ast.And) else all(parts) and any(_negated(v, file, given) for v in n.values)
    return _negated(n, file, given) or (isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not) and _cuda_up(n.operand))


def _negated(n, file, given=frozenset()) -> bool:
    return isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not) and _true_capturing(n.operand, file, given)


def skipped_under_capture(test: ast.AST, file: str | None = None, given=frozenset()) -> tuple[bool, bool]:
    """(body, orelse): which side of an `if` cannot run while a graph is being captured, so a wait
    there never reaches the capture (`if not torch.cuda.is_current_stream_capturing(): sync()`); `given`:
    names the guarded line reads, present when it runs."""
    # the body is skipped when the test is false while capturing (`not CAP and ...`); the orelse when it holds
    # then: an `or` with the capture test, or an `and` of it with presence checks (`isinstance(q, torch.Tensor) and
    # is_tracing(q)`) or availability checks (`torch.cuda.is_available() and CAP`)
    return _false_capturing(test, file, given), _true_capturing(test, file, given)


def _short_circuited(test: ast.AST, line: int, file: str, given=frozenset()) -> bool:
    """`line` is in an operand of the test that a capture never evaluates: after `not CAP` in an `and`,
    after `CAP` in an `or` (`if not is_tracing(m) and m.all():`)."""
    for n in ast.walk(test):
        if not isinstance(n, ast.BoolOp):
            continue
        for i, v in enumerate(n.values[:-1]):
            stop = _false_capturing(v, file, given) if isinstance(n.op, ast.And) else _true_capturing(v, file, given)
            if stop and any(w.lineno <= line <= (w.end_lineno or w.lineno) for w in n.values[i + 1:]):
                return True
    return False


def _names_on(func, line: int) -> frozenset:
    """The plain names `line` reads in `func`."""
    return frozenset(n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                     and n.lineno == line)


def _exits(body: list) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise))


def _exited_before(func, line: int, file: str, given=frozenset()):
    """The test of an `if CAP: return ...` (no else) ahead of `line` in `func`'s body, or None."""
    for st in getattr(func, "body", []) if isinstance(getattr(func, "body", None), list) else []:
        if st.lineno > line or (st.end_lineno or st.lineno) >= line:
            return None
        if isinstance(st, ast.If) and not st.orelse and _exits(st.body) and skipped_under_capture(st.test, file, given)[1]:
            return st.test
    return None


def capture_guard(filename: str, line: int) -> str | None:
    """The test that keeps `line` from running while a graph is being captured: an `if` whose side holding
    it cannot run then (`if not torch.cuda.is_current_stream_capturing():`), an operand a capture
    short-circuits, or an early exit ahead of it (`if is_tracing(m): return False`); else None."""
    if tree(filename) is None:
        return None
    func = enclosing_function(filename, line)
    given = _names_on(func, line) if func is not None else frozenset()
    for node, part in chain(func, line) if func is not None else []:
        if isinstance(node, ast.If) and part in ("body", "orelse"):
            body, orelse = skipped_under_capture(node.test, filename, given)
            if (body and part == "body") or (orelse and part == "orelse"):
                return ast.unparse(node.test)
    for node in ast.walk(func) if func is not None and not isinstance(func, ast.Module) else ():
        test = getattr(node, "test", None)
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)) and test is not None \
                and test.lineno <= line <= (test.end_lineno or test.lineno) and _short_circuited(test, line, filename, given):
            return ast.unparse(test)
        if isinstance(node, ast.Return) and node.value is not None and node.lineno <= line <= \
                (node.end_lineno or node.lineno) and _short_circuited(node.value, line, filename, given):
            return ast.unparse(node.value)
    exit_test = _exited_before(func, line, filename, given) if func is not None and not isinstance(func, ast.Module) else None
    return f"{ast.unparse(exit_test)}: return" if exit_test is not None else None
