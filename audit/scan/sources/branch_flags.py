"""What the plain flags in a function's `if` tests held while the step ran, read without running code.

A CPU scan reads waits it cannot trace from the source: `if x.is_cuda: torch.cuda.synchronize()` never
runs here, yet runs on a GPU. Whether it runs there also depends on the other conditions on the way to it:
`if self.timing and x.is_cuda:`, or a device test nested in `if self.debug:`. Those conditions do not
depend on the device, so what they held here they hold on the GPU. The tracer hands this module each
frame of user or library code once per audited step; it reads the flags of that function's `if` tests (a
name, an attribute chain, `not` of one, a comparison with a constant) from the frame: parameters the
function never rebinds (or binds only before the test, outside any loop: `x, w = args` in a dispatch
implementation), module globals, attributes found by `inspect.getattr_static` (an instance's or a module's own
attribute as stored: `F.linear`), and `is` between two such reads (`func is F.linear`), which runs no code. A property, a
`__getattr__`, a tensor or an object with its own `__bool__` is never evaluated: its value stays unknown.
guarded_sync drops a wait only where a flag on its way was seen and always held the other value.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import types

import torch
from audit.scan.snapshot.own_dict import own_dict
from audit.scan.sources.frame_source import function_of

__all__ = ["BranchFlags", "flag_exprs"]

_UNKNOWN = object()
_PLAIN = (type(None), bool, int, float, str, bytes)
_CONTAINERS = (list, tuple, dict, set, frozenset)
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Is: lambda a, b: a is b,
            ast.IsNot: lambda a, b: a is not b, ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


def _simple(e) -> bool:
    """A flag read that runs no code of the target: a name or attribute chain, `not` of one, or one
    compared with a constant (`self.mode == "debug"`, `self.timer is not None`)."""
    if isinstance(e, ast.Name):
        return True
    if isinstance(e, ast.Attribute):
        return _simple(e.value) and not isinstance(e.value, ast.Compare)
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
        return _simple(e.operand)
    if isinstance(e, ast.Compare) and len(e.ops) == 1 and type(e.ops[0]) in _COMPARE:
        a, b = e.left, e.comparators[0]
        if isinstance(e.ops[0], (ast.Is, ast.IsNot)) and _simple(a) and _simple(b):
            return True  # identity runs no code: `func is F.linear` in a __torch_function__ / __torch_dispatch__
        return (_simple(a) and isinstance(b, ast.Constant)) or (_simple(b) and isinstance(a, ast.Constant))
    return False


def flag_exprs(test) -> list:
    """The flag reads of an `if` test to record: the test itself, and the operands of an `and` / `or`."""
    parts = [test, *(test.values if isinstance(test, ast.BoolOp) else ())]
    return [p for p in parts if _simple(p) and not isinstance(p, ast.Constant)]


def _watches(code):
    """(line, text, expr) for every flag read of the function's `if` tests, and the names it rebinds."""
    func = function_of(code)
    if func is None:
        return None
    out = []
    for node in ast.walk(func):  # an `if`, a conditional expression, an `and` / `or` anywhere (guarded_sync._guards)
        test = node.test if isinstance(node, (ast.If, ast.IfExp)) else node if isinstance(node, ast.BoolOp) else None
        if test is not None:
            out += [(node.lineno, ast.unparse(e), e) for e in flag_exprs(test)]
    if not out:
        return None
    return tuple(out), _stores(func)


def _stores(func) -> dict:
    """name -> the last line the function binds it on, or None where a loop may bind it again (`for`, `while`,
    a comprehension): a local bound once before a test (`x, w = args` in a dispatch implementation) holds the
    value the test reads once the function has gone past that line."""
    out, looped = {}, set()
    for node in ast.walk(func):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.comprehension)):
            looped |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out[node.id] = max(out.get(node.id, 0), node.lineno)
    return {k: None if k in looped else v for k, v in out.items()}


def _attr(obj, name: str):
    try:
        v = inspect.getattr_static(obj, name)
    except AttributeError:
        if isinstance(obj, torch.nn.Module):  # parameters, buffers and submodules live in their own dicts
            for d in ("_parameters", "_buffers", "_modules"):
                held = obj.__dict__.get(d) or {}
                if name in held:
                    return held[name]
        return _UNKNOWN
    own = own_dict(obj)
    if not isinstance(obj, type) and isinstance(own, dict) and name in own:
        return own[name]  # an instance's (a module's) own attribute, `F.linear`: no descriptor runs on it
    if isinstance(v, types.MemberDescriptorType):  # a __slots__ field
        try:
            return v.__get__(obj, type(obj))
        except AttributeError:
            return _UNKNOWN
    if isinstance(v, _PLAIN + _CONTAINERS) or not hasattr(type(v), "__get__"):
        return v
    return _UNKNOWN  # a property, a method, any other descriptor: running it is the target's code


def _value(e, frame, stored, line=0):
    if isinstance(e, ast.Constant):
        return e.value
    if isinstance(e, ast.Name):
        code = frame.f_code
        last = stored.get(e.id, 0)
        if e.id in stored and (last is None or not last < min(line, frame.f_lineno)):
            return _UNKNOWN  # rebound in the function: its value when the test ran is not its value now
        if e.id in code.co_varnames or e.id in code.co_cellvars or e.id in code.co_freevars:
            return frame.f_locals.get(e.id, _UNKNOWN)
        g = frame.f_globals
        return g[e.id] if e.id in g else getattr(builtins, e.id, _UNKNOWN)
    if isinstance(e, ast.Attribute):
        base = _value(e.value, frame, stored, line)
        return _UNKNOWN if base is _UNKNOWN else _attr(base, e.attr)
    if isinstance(e, ast.UnaryOp):
        t = _truth(_value(e.operand, frame, stored, line))
        return _UNKNOWN if t is None else not t
    if isinstance(e, ast.Compare):
        a, b = _value(e.left, frame, stored, line), _value(e.comparators[0], frame, stored, line)
        if a is _UNKNOWN or b is _UNKNOWN:
            return _UNKNOWN
        if type(e.ops[0]) not in (ast.Is, ast.IsNot) and not (isinstance(a, _PLAIN) and isinstance(b, _PLAIN + (tuple, frozenset))):
            return _UNKNOWN  # an object's own __eq__ is its code
        return _COMPARE[type(e.ops[0])](a, b)
    return _UNKNOWN


def _truth(v) -> bool | None:
    if v is _UNKNOWN:
        return None
    if isinstance(v, _PLAIN) or type(v) in _CONTAINERS:
        return bool(v)
    t = type(v)
    if isinstance(v, torch.Tensor) or hasattr(t, "__bool__") or hasattr(t, "__len__"):
        return None
    return True


class BranchFlags:
    """Reads each function's watched flags once per audited step into `seen[(file, line, text)]`."""

    def __init__(self, seen: dict, on: bool = True):
        self.seen, self.on = seen, on  # off on a CUDA scan: its device branches ran, or are not taken
        self.watched: dict = {}  # id(code) -> (code, flag reads, rebound names): functions with flags only
        self._done: set = set()  # id(code) of the functions read in step `_at`
        self._at = None

    def learn(self, code) -> None:
        """A function seen for the first time: watched if its `if` tests read plain flags."""
        w = _watches(code) if self.on else None
        if w is not None:
            self.watched[id(code)] = (code, *w)
        else:
            self.watched.pop(id(code), None)

    def note(self, code, frame, step: int) -> None:
        """A watched function's frame in an op's stack: its flags are read once per step."""
        if step != self._at:
            self._at = step
            self._done.clear()
        if id(code) in self._done or self.watched[id(code)][0] is not code:
            return
        self._done.add(id(code))
        _, exprs, stored = self.watched[id(code)]
        for line, text, e in exprs:
            try:
                t = _truth(_value(e, frame, stored, line))
            except Exception:  # noqa: BLE001 - a flag we cannot read stays unknown
                t = None
            if t is not None:
                self.seen.setdefault((code.co_filename, line, text), set()).add(t)
