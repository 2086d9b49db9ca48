"""Which side of an `if` a GPU takes, read from the test alone, for library code.

A library's device branches are read only when the test says for sure which side runs on CUDA and
which on the CPU: `x.is_cuda`, `x.is_cpu`, `x.device.type == "cuda"`, `dev.type != "cpu"`, `torch.cuda.is_available()`,
a process group's backend compared with NCCL (`dist.get_backend(group) == "nccl"`: NCCL runs on CUDA only),
and `not` / `and` / `or` of those. A comparison of one of the CUDA caching allocator's byte counters
(`torch.cuda.memory_reserved() > limit`, `memory_allocated`, `max_memory_*`, `memory_cached`) is read the same
way: without CUDA they read 0, so the side where the counter exceeds the bound never runs on a CPU scan,
and a GPU holding memory takes it. A call of a helper (`elif is_cuda_available():`, accelerate's
`clear_device_cache()`) is read through the helper when the file it is called from is known: its value is
the one every return of the helper settles (`available = torch.cuda.is_available(); return available`), a
few helpers down; so is a flag every assignment of which settles it (`self.use_fast_path =
torch.cuda.is_available()`, or a plain default its owner overrides: `self.mixer.use_fast_path =
torch.device(device).type == "cuda"`). A test on anything else (an MPS workaround, a plain flag, data) is left alone: the
side a CPU scan skipped need not be the one a GPU runs.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect

from audit.detectors.source.lookup import enclosing_function
from audit.detectors.state import handoff
from audit.scan.sources.ast_nodes import nodes_of

DEPTH = 3  # helpers of helpers read for a device test
_CUDA, _CPU = "cuda", "cpu"
_COUNTERS = {f"torch.cuda.{n}" for n in ("memory_allocated", "memory_reserved", "max_memory_allocated",
                                          "max_memory_reserved", "memory_cached", "max_memory_cached")}


def cuda_side(test: ast.AST, resolve=None, known=None, file: str | None = None):
    """"body" or "orelse": the side of an `if` with this test that runs on CUDA and not on the CPU;
    None when the test does not settle it. `resolve(expr)`: the (value, line) assignments of a name or
    `self.attr` (`scopes.values`), for a test on an object made only on one device (`s is not None`).
    `known(expr)`: the value a plain flag held through the scan on any device (`self.timing` in
    `if self.timing and x.is_cuda:`; audit/detectors/device/flag_reach.py), None when not known. `file`: the
    file the test is written in, whose helpers a call in the test is read through."""
    on_cuda, on_cpu = _eval(test, _CUDA, resolve, known, file), _eval(test, _CPU, resolve, known, file)
    if on_cuda is True and on_cpu is False:
        return "body"
    if on_cuda is False and on_cpu is True:
        return "orelse"
    return None


def _eval(n, dev: str, resolve=None, known=None, file=None, depth=0):
    """The test's truth value on device type `dev`, or None when it depends on more than the device."""
    if known is not None and (held := known(n)) is not None:
        return held
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
        v = _eval(n.operand, dev, resolve, known, file, depth)
        return None if v is None else not v
    if isinstance(n, ast.BoolOp):
        vals = [_eval(v, dev, resolve, known, file, depth) for v in n.values]
        if any(v is None for v in vals):
            return None
        return all(vals) if isinstance(n.op, ast.And) else any(vals)
    if isinstance(n, ast.Attribute) and n.attr in ("is_cuda", "is_cpu"):
        return dev == (_CUDA if n.attr == "is_cuda" else _CPU)
    if isinstance(n, ast.Call) and _dotted(n.func) in ("torch.cuda.is_available", "torch.cuda.is_initialized"):
        return dev == _CUDA
    if isinstance(n, ast.Compare) and len(n.ops) == 1 and (held := _counter_exceeds(n)) is not None:
        return held if dev == _CUDA else not held
    if isinstance(n, ast.Compare) and len(n.ops) == 1 and (held := nccl_backend(n)) is not None:
        return held if dev == _CUDA else not held
    if isinstance(n, ast.Call) and _dotted(n.func).endswith("is_nccl_available"):
        return dev == _CUDA  # a CUDA build of torch, as torch.cuda.is_available() on a machine with a GPU
    if resolve is not None and (held := _made_on(n, dev, resolve)) is not None:
        return held
    if resolve is not None and depth < DEPTH and (held := _assigned(n, dev, resolve, file, depth)) is not None:
        return held
    if isinstance(n, ast.Call) and file is not None and depth < DEPTH and (held := _helper(file, n.func, dev, depth)) is not None:
        return held
    if isinstance(n, ast.Compare) and len(n.ops) == 1:
        sides = [n.left, n.comparators[0]]
        name = next((_device_name(s) for s in sides if _device_name(s) is not None), None)
        if name is None or not any(_device_value(s) for s in sides):
            return None
        op = n.ops[0]
        if isinstance(op, (ast.Eq, ast.Is)):
            return dev == name
        if isinstance(op, (ast.NotEq, ast.IsNot)):
            return dev != name
    return None


def _helper(file: str, func: ast.expr, dev: str, depth: int):
    """The value on `dev` of a call of the helper `func` names in `file` (`is_cuda_available()`), when
    every return of the helper settles it alike; None otherwise."""
    code = None
    with contextlib.suppress(Exception):
        code = inspect.unwrap(handoff.resolve(file, func)).__code__
    return None if code is None else _returns(code.co_filename, code.co_firstlineno, code.co_name, dev, depth + 1)


@functools.lru_cache(maxsize=1024)
def _returns(file: str, first: int, name: str, dev: str, depth: int):
    """The one truth value on `dev` of every return of the function defined at `first` of `file` (outside
    `except` and nested functions), each read through the locals bound once (`available = ...; return
    available`); None when one is not settled or they differ."""
    func = enclosing_function(file, first + 1)
    if func is None or getattr(func, "name", None) != name:
        return None
    own = list(_own_nodes(func))
    bound: dict = {}
    for node in own:
        for t in node.targets if isinstance(node, ast.Assign) else ():
            if isinstance(t, ast.Name):
                bound[t.id] = node.value if t.id not in bound else None
        if isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name):
            bound[node.target.id] = None
    held, seen = set(), []

    def local(e):  # a local's value, read from its one assignment
        if not isinstance(e, ast.Name) or bound.get(e.id) is None or e.id in seen or len(seen) > 4:
            return None
        seen.append(e.id)
        try:
            return _eval(bound[e.id], dev, None, local, file, depth)
        finally:
            seen.pop()
    for r in (n for n in own if isinstance(n, ast.Return)):
        v = None if r.value is None else _eval(r.value, dev, None, local, file, depth)
        if v is None:
            return None
        held.add(bool(v))
    return held.pop() if len(held) == 1 else None


def _own_nodes(func):
    """The nodes of a function's body, not those of nested functions, classes or `except` handlers."""
    todo = list(func.body)
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ExceptHandler)):
            continue
        yield n
        todo.extend(ast.iter_child_nodes(n))


def _made_on(n, dev: str, resolve):
    """`s is not None`, `s is None` or bare `s`, where every assignment of `s` is `A if <device test> else
    None` (or the other way round): a stream or event made only on CUDA (`s = torch.cuda.current_stream()
    if x.is_cuda else None`). True when `s` holds an object on device `dev`; None when not settled."""
    name, want = n, True
    if isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], (ast.Is, ast.IsNot)) and \
            isinstance(n.comparators[0], ast.Constant) and n.comparators[0].value is None:
        name, want = n.left, isinstance(n.ops[0], ast.IsNot)
    if not isinstance(name, (ast.Name, ast.Attribute)):
        return None
    vals, held = resolve(name), set()
    for v, _ in vals or ():
        if not isinstance(v, ast.IfExp):
            return None
        none = [isinstance(x, ast.Constant) and x.value is None for x in (v.body, v.orelse)]
        test = _eval(v.test, dev) if none[0] != none[1] else None
        if test is None:
            return None
        held.add(test if none[1] else not test)
    return (held.pop() == want) if len(held) == 1 else None


def _assigned(n, dev: str, resolve, file, depth: int):
    """A flag every assignment of which settles the device alike (`self.use_fast_path =
    torch.cuda.is_available()`, then `if self.use_fast_path: return fused(x)` ahead of a reference path): the
    value they all give on `dev`; None when one assignment depends on more than the device."""
    if not isinstance(n, (ast.Name, ast.Attribute)):
        return None
    vals = resolve(n) or ()
    if vals and isinstance(n, ast.Attribute) and file is not None and all(isinstance(v, ast.Constant) for v, _ in vals):
        vals = _set_from_outside(file, n.attr) or vals
    held = {_eval(v, dev, None, None, file, depth + 1) for v, _ in vals}
    return held.pop() if len(held) == 1 and None not in held else None


def _set_from_outside(file: str, attr: str) -> list:
    """(value, line) of the assignments of `attr` on another object (`self.mixer.use_fast_path =
    torch.device(device).type == "cuda"` in the runner that builds the mixer) in `file`: a flag its own class
    only gives a plain default (`self.use_fast_path = False`) holds what its owner sets once it is built."""
    from audit.detectors.source.lookup import tree

    t = tree(file)
    return [(node.value, node.lineno) for node in (nodes_of(t, ast.Assign) if t is not None else ())
            if any(isinstance(x, ast.Attribute) and x.attr == attr and not (
                isinstance(x.value, ast.Name) and x.value.id in ("self", "cls")) for x in node.targets)]


def nccl_backend(n: ast.Compare):
    """For a test of a process group's backend against NCCL (`dist.get_backend(group) == "nccl"`,
    `== Backend.NCCL`, `"nccl" in dist.get_backend()`): True when it holds on an NCCL group, False for `!=` /
    `not in`; None when it is no such test. NCCL runs on CUDA devices only: a CPU scan's group is gloo, and a
    GPU deployment of a tensor-parallel library takes the NCCL side."""
    left, right, op = n.left, n.comparators[0], n.ops[0]
    backend = [isinstance(s, ast.Call) and _dotted(s.func).endswith("get_backend") for s in (left, right)]
    nccl = [(isinstance(s, ast.Constant) and isinstance(s.value, str) and s.value.lower() == "nccl")
            or (isinstance(s, ast.Attribute) and s.attr == "NCCL") for s in (left, right)]
    if not ((backend[0] and nccl[1]) or (backend[1] and nccl[0])):
        return None
    if isinstance(op, (ast.Eq, ast.Is)) or (isinstance(op, ast.In) and nccl[0]):
        return True
    if isinstance(op, (ast.NotEq, ast.IsNot)) or (isinstance(op, ast.NotIn) and nccl[0]):
        return False
    return None


def _counter_exceeds(n: ast.Compare):
    """For `counter > bound` (or `>=`, or the bound on the left): True when the test holds where the
    counter is above the bound, False for `<` / `<=` (it holds where the counter is below); None when no
    side is an allocator counter's call. Without CUDA the counter is 0: the other side."""
    left, right, op = n.left, n.comparators[0], n.ops[0]
    is_counter = [isinstance(s, ast.Call) and _dotted(s.func) in _COUNTERS for s in (left, right)]
    if is_counter[0] == is_counter[1] or not isinstance(op, (ast.Gt, ast.GtE, ast.Lt, ast.LtE)):
        return None
    above = isinstance(op, (ast.Gt, ast.GtE))
    return above if is_counter[0] else not above


def _device_name(n) -> str | None:
    """"cuda" / "cpu" written as a constant or `torch.device("cuda")`, else None."""
    if isinstance(n, ast.Call) and _dotted(n.func) == "torch.device" and n.args:
        n = n.args[0]
    if isinstance(n, ast.Constant) and isinstance(n.value, str):
        kind = n.value.split(":")[0]
        return kind if kind in (_CUDA, _CPU) else None
    return None


def _device_value(n) -> bool:
    """An expression read off a tensor's or module's device: `x.device`, `x.device.type`, `dev.type`, or the
    type of a device made from a name (`torch.device(device).type`)."""
    return isinstance(n, ast.Attribute) and (n.attr == "device" or (n.attr == "type" and (
        (isinstance(n.value, ast.Attribute) and n.value.attr == "device")
        or (isinstance(n.value, ast.Call) and _dotted(n.value.func) == "torch.device"))))


def _dotted(n) -> str:
    parts = []
    while isinstance(n, ast.Attribute):
        parts.append(n.attr)
        n = n.value
    if isinstance(n, ast.Name):
        parts.append(n.id)
    return ".".join(reversed(parts))
