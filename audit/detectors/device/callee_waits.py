"""The waits inside a helper called from a branch a CPU scan did not take.

`if y.is_cuda: _drain(y)` hides the wait one call further: the branch ran nothing on the CPU, so
nothing was traced in `_drain` either. The call is resolved statically (a module-level function, a
module attribute, a method of the caller's own class through `self.`/`cls.`), and the helper's
source is read for synchronizing calls, following its own calls a few levels down. Inside a helper,
a side the test says only the CPU runs (`if not x.is_cuda: return x.cpu()`) is skipped. Torch and
the standard library are not followed (frame_kind HIDDEN): their waits are the named calls the
rule already knows.
"""

from __future__ import annotations

import ast
import contextlib
import inspect

from audit.detectors.state import handoff
from audit.detectors.source import lookup, scopes
from audit.detectors.device.cuda_side import cuda_side
from audit.scan.sources.user_code import HIDDEN, frame_kind

DEPTH = 3  # helpers of helpers followed below the branch's own call


def _method(file: str, func: ast.expr, line: int):
    """`self.m` / `cls.m` at `line` of `file`: the attribute of the enclosing class, looked up on the
    loaded class object (so an inherited method resolves too)."""
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in ("self", "cls")):
        return None
    tree = lookup.tree(file)
    owner = scopes.owners(tree, line)[1] if tree is not None else None
    cls = handoff.resolve(file, ast.Name(id=owner.name)) if owner is not None else None
    return inspect.getattr_static(cls, func.attr, None) if isinstance(cls, type) else None


def _function(file: str, call: ast.Call, roots):
    """(function AST, its file) that a call in `file` names, when it is Python code outside torch."""
    obj = handoff.resolve(file, call.func) or _method(file, call.func, call.lineno)
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    code = None
    with contextlib.suppress(Exception):
        code = inspect.unwrap(obj).__code__
    if code is None or frame_kind(code.co_filename, roots) == HIDDEN:
        return None
    func = lookup.enclosing_function(code.co_filename, code.co_firstlineno + 1)
    return (func, code.co_filename) if func is not None and getattr(func, "name", None) == code.co_name else None


def _statements(func, file: str):
    """The statements of a function a GPU would run: each `if` whose test settles the device keeps
    only its CUDA side."""
    resolve = (lambda expr, _t=lookup.tree(file): scopes.values(_t, expr, func.lineno) if _t is not None else None)
    todo = list(func.body)
    while todo:
        st = todo.pop(0)
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(st, ast.If):
            side = cuda_side(st.test, resolve, file=file)
            todo[:0] = st.body if side == "body" else st.orelse if side == "orelse" else [*st.body, *st.orelse]
            yield st.test
            continue
        yield st


gpu_statements = _statements  # also read for the kernel a GPU runs in place of a custom op's CPU kernel


def waits_below(file: str, statements, sync_call, roots, depth: int = DEPTH, seen=None):
    """(file, line, function name, what) for each synchronizing call inside the helpers the statements
    call (not the statements' own calls: the rule reads those itself)."""
    seen = set() if seen is None else seen
    for st in statements:
        for call in (n for n in ast.walk(st) if isinstance(n, ast.Call)):
            if sync_call(call):
                continue
            hit = _function(file, call, roots)
            if hit is None or (hit[1], hit[0].lineno) in seen:
                continue
            seen.add((hit[1], hit[0].lineno))
            func, where = hit
            body = list(_statements(func, where))
            for inner in body:
                for c in (n for n in ast.walk(inner) if isinstance(n, ast.Call)):
                    what = sync_call(c)
                    if what:
                        yield where, c.lineno, func.name, what
            if depth > 1:
                yield from waits_below(where, body, sync_call, roots, depth - 1, seen)
