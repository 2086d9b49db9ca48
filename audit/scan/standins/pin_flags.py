"""Where a false `pin_memory=` flag came from: a platform probe, or the code's own choice.

Serving code pins its staging buffers where the platform allows it: vLLM keeps
`self.pin_memory = is_pin_memory_available()` in its runner and passes it down
(`CpuGpuBuffer(..., pin_memory=self.pin_memory)` -> `torch.zeros(..., pin_memory=pin_memory)`). On a CPU-only
torch the probe answers False, so the buffer a GPU would pin is pageable here, and uploading it would look
like a pageable-copy. While the target is built (audit.scan.standins.pinned's stand-in), a factory called with a false
flag has the flag's expression followed back from the calling frame: through parameters to the caller's
argument, through a local, `self.x` or a module global (`PIN = torch.cuda.is_available()`) to its assignment,
a few hops at most. A flag computed by a call (the
probe) counts as pinned; one that is a constant or comes from a constant (`SeqLens(n, pinned=False)`) is the
code's choice, and stays pageable. A device test that holds on a GPU is a probe too (`pin = torch.device(device).type
== "cuda"`, `device != "cpu"`, `x.is_cuda`): it is False only because the scan runs on the CPU, and a GPU pins the
buffer; not when the device it reads is itself a constant (`alloc(n, "cpu")`).
"""

from __future__ import annotations

import ast
import os
import sys

import torch

import audit
from audit.scan.sources.ast_nodes import calls_at
from audit.scan.sources.frame_source import function_of, tree

__all__ = ["probed"]

_AUDIT = os.path.dirname(os.path.abspath(audit.__file__))  # the audit package
_SKIP = (os.path.dirname(torch.__file__), _AUDIT)  # torch's and the audit's frames


def _gpu_test(expr):
    """For a device test that holds on a GPU (`x.is_cuda`, `dev.type == "cuda"`, `torch.device(device).type ==
    "cuda"`, `device != "cpu"`): the expression it reads the device from; None for anything else (`device ==
    "cpu"` holds on the CPU, and a flag anded with it is the code's own choice)."""
    if isinstance(expr, ast.Attribute):
        return expr.value if expr.attr == "is_cuda" else None
    if not (isinstance(expr, ast.Compare) and len(expr.ops) == 1):
        return None
    sides, op = [expr.left, expr.comparators[0]], expr.ops[0]
    kind = [s.value.split(":")[0] if isinstance(s, ast.Constant) and isinstance(s.value, str) else None for s in sides]
    if (kind[0] is None) == (kind[1] is None):
        return None
    other, name = (sides[1], kind[0]) if kind[0] else (sides[0], kind[1])
    holds = (isinstance(op, (ast.Eq, ast.Is)) and name == "cuda") or (isinstance(op, (ast.NotEq, ast.IsNot)) and name == "cpu")
    return other if holds and not isinstance(other, ast.Constant) else None


def _function(frame):
    """The def node of the frame's function (None at module level or without source)."""
    return function_of(frame.f_code)


def _calls_at(frame):
    t = tree(frame.f_code.co_filename)
    line = frame.f_lineno
    return calls_at(t, line) if t is not None else []


def _argument(caller, callee, name: str, index: int):
    """The expression `caller` passes at its current line for parameter `name` (position `index`) of the
    function running in frame `callee`: `Cls(...)` or `super().__init__(...)` for an __init__, `f(...)` or
    `x.f(...)` otherwise."""
    fn = callee.f_code.co_name
    cls = type(callee.f_locals.get("self")).__name__ if "self" in callee.f_locals else None
    shift = 1 if callee.f_code.co_varnames[:1] in (("self",), ("cls",)) else 0  # not passed explicitly
    for call in _calls_at(caller):
        name_of = getattr(call.func, "attr", getattr(call.func, "id", None))
        if name_of != fn and not (fn == "__init__" and name_of == cls):
            continue
        kw = next((k.value for k in call.keywords if k.arg == name), None)
        if kw is not None:
            return kw
        if 0 <= index - shift < len(call.args):
            return call.args[index - shift]
    return None


def _default(fn, name: str):
    """The default value of parameter `name` in the def node `fn` (`pin_memory=is_pin_memory_available()`)."""
    if fn is None:
        return None
    a = fn.args
    pos = a.posonlyargs + a.args
    named = dict(zip([p.arg for p in pos[len(pos) - len(a.defaults):]], a.defaults))
    named.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    return named.get(name)


def _assigned(node, target) -> list:
    """The values assigned to `target` (a Name id, or ('self', attr)) anywhere under node."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                if (isinstance(t, ast.Name) and t.id == target) or (
                        isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and (t.value.id, t.attr) == target):
                    out.append(n.value)
    return out


def _module_assigned(filename: str, name: str) -> list:
    """The values the module's own statements (not its functions' or classes' bodies) assign to `name`."""
    t = tree(filename)
    out, todo = [], list(t.body) if t is not None else []
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out += [node.value for x in targets if isinstance(x, ast.Name) and x.id == name]
        todo.extend(ast.iter_child_nodes(node))
    return out


def _origin(expr, frame, hops: int, module: str | None = None) -> str:
    """'probe' (computed by a call), 'constant', or 'unknown'; `module`: the file whose globals a name read at
    module level (no frame) is looked up in."""
    if hops <= 0 or expr is None:
        return "unknown"
    if isinstance(expr, ast.Constant):
        return "constant"
    if isinstance(expr, ast.Call):
        return "probe"
    if (read := _gpu_test(expr)) is not None:  # False only because the scan runs on the CPU, unless set so
        return "constant" if _origin(read, frame, hops - 1, module) == "constant" else "probe"
    if isinstance(expr, (ast.BoolOp, ast.UnaryOp, ast.Compare, ast.IfExp)):
        parts = [_origin(e, frame, hops, module) for e in ast.iter_child_nodes(expr) if isinstance(e, ast.expr)]
        return "probe" if "probe" in parts else "constant" if parts and all(p == "constant" for p in parts) else "unknown"
    if isinstance(expr, ast.Name) and frame is None and module is not None:
        values = _module_assigned(module, expr.id)
        return _origin(values[0], None, hops - 1, module) if len(values) == 1 else "unknown"
    if isinstance(expr, ast.Name) and frame is not None:
        code = frame.f_code
        if code.co_name in _COMPREHENSIONS and frame.f_back is not None and expr.id in code.co_freevars:
            return _origin(expr, frame.f_back, hops, module)  # `[torch.zeros(n, pin_memory=pin) for _ in layers]`
        params = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        fn = _function(frame)
        if expr.id in params:
            passed = _argument(frame.f_back, frame, expr.id, params.index(expr.id)) if frame.f_back else None
            return _origin(passed, frame.f_back, hops - 1) if passed is not None else \
                _origin(_default(fn, expr.id), None, hops - 1)
        values = _assigned(fn, expr.id) if fn is not None else []
        if not values and expr.id in frame.f_globals:  # `PIN = torch.cuda.is_available()` at module level
            return _origin(expr, None, hops, code.co_filename)
        return _origin(values[-1], frame, hops - 1) if len(values) == 1 else "unknown"
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and frame is not None:
        owner = frame.f_locals.get(expr.value.id)
        t = tree(frame.f_code.co_filename)
        values = _assigned(t, (expr.value.id, expr.attr)) if owner is not None and t is not None else []
        return _origin(values[0], None, hops - 1) if len(values) == 1 else "unknown"
    return "unknown"


_COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")  # a frame of their own before Python 3.12
origin, SKIP = _origin, _SKIP  # for audit.scan.standins.pin_arms: a flag's origin, the frames never the target's


def probed() -> bool:
    """Called from a factory given a false `pin_memory=`: was that flag a platform probe's answer?"""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP):
        frame = frame.f_back
    if frame is None:
        return False
    for call in _calls_at(frame):
        kw = next((k.value for k in call.keywords if k.arg == "pin_memory"), None)
        if kw is not None:
            return _origin(kw, frame, 4) == "probe"
    return False
