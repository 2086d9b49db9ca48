"""Kernels a CPU scan runs that a GPU would not: a custom op's implementation registered for the CPU only.

A custom op may have one kernel per device: `torch.library.custom_op(..., device_types="cpu")` with a
`register_kernel("cuda")` beside it, a `register_kernel("cpu")` reference path beside a device-generic body, or
`Library.impl(name, cpu_fn, "CPU")` beside `impl(name, cuda_fn, "CUDA")`. A CPU scan runs the CPU kernel (numpy,
`.tolist()`) and traces its reads, yet on a GPU the dispatcher picks the other kernel and those reads never
happen: the CPU's side of a device choice, made by the dispatcher as `if x.is_cuda:` makes one in Python. The
tracer notes each such kernel it runs (custom_ops.python_body); detectors keep what was traced inside it as info
(detectors/device/cpu_only.py). A kernel registered for both devices, or for the CPU alone, is no CPU-only side.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
import re

__all__ = ["GPU_KERNELS", "KERNELS", "note_custom_op", "note_library"]

KERNELS: dict[tuple[str, int], str] = {}  # (file, first line of the kernel's code) -> what a GPU runs instead
# the same key -> (file, first line of its code, name) of the kernel a GPU runs instead, for its source to be read
GPU_KERNELS: dict[tuple[str, int], tuple[str, int, str]] = {}
_REGISTERED = re.compile(r"^(\w+)(?:\[alias\])?: registered at (.+\.py):(\d+)", re.M)


def note_custom_op(name: str, fns: dict, dev: str | None) -> None:
    """`torch.library.custom_op` kernels by device type (`fns`, torch's `_backend_fns`): the CPU's, when a GPU
    would run another one (a CUDA kernel, or the device-generic body)."""
    cpu = _user_fn(fns.get("cpu")) if dev == "cpu" else None
    gpu = _user_fn(fns.get("cuda") or fns.get(None))
    code = getattr(cpu, "__code__", None) if cpu is not None and gpu not in (None, cpu) else None
    if code is not None:
        KERNELS[(code.co_filename, code.co_firstlineno)] = \
            f"`{name}`'s kernel registered for the CPU (a GPU runs `{getattr(gpu, '__name__', gpu)}`)"
        if (gcode := getattr(gpu, "__code__", None)) is not None:
            GPU_KERNELS[(code.co_filename, code.co_firstlineno)] = (gcode.co_filename, gcode.co_firstlineno, name)


def _user_fn(f):
    """The function a custom op's per-device entry calls: torch wraps it (`wrapped_fn`, closing over `fn`)."""
    for _ in range(4):
        f = inspect.unwrap(f) if callable(f) else None
        if f is None or not (getattr(f, "__module__", "") or "").startswith("torch"):
            return f
        try:
            f = inspect.getclosurevars(f).nonlocals.get("fn")
        except (TypeError, ValueError):
            return None
    return None


@functools.lru_cache(maxsize=None)
def note_library(name: str, dump: str) -> None:
    """`Library.impl` kernels (`dump`: the dispatcher's registrations of op `name`): the CPU key's, when the CUDA
    key has a kernel registered with another function."""
    keys = {k: f for k, f, _ in _REGISTERED.findall(dump)}  # the line is the Library's, not the impl's
    if "CPU" not in keys or "CUDA" not in keys:
        return
    short = name.split("::")[-1]
    cpu, gpu = _kernel_def(keys["CPU"], short, "CPU"), _kernel_def(keys["CUDA"], short, "CUDA")
    if cpu is not None and gpu is not None and cpu[0] != gpu[0]:
        KERNELS[(keys["CPU"], cpu[1])] = f"`{name}`'s CPU kernel `{cpu[0]}` (a GPU runs `{gpu[0]}`)"
        GPU_KERNELS[(keys["CPU"], cpu[1])] = (keys["CUDA"], gpu[1], name)


def _kernel_def(file: str, op: str, key: str):
    """(name, first line of its code) of the module-level function the file registers for `op` under dispatch
    key `key`: `lib.impl("op", fn, "CPU")` (or `dispatch_key="CPU"`), or a def decorated with
    `@torch.library.impl(lib, "op", "CPU")`; None when the file says nothing (or two things) about it."""
    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except SyntaxError:
        return None
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = set()
    for node in ast.walk(tree):
        for call, fn in _registrations(node, defs):
            consts = [a.value for a in (*call.args, *(k.value for k in call.keywords)) if isinstance(a, ast.Constant)]
            if op in consts or any(isinstance(c, str) and c.endswith("::" + op) for c in consts):
                if key in consts or any(isinstance(c, (list, tuple)) and key in c for c in consts):
                    found.add((fn.name, _first(fn)))
    return found.pop() if len(found) == 1 else None


def _registrations(node, defs):
    """(registering call, function) of a statement: `x.impl(..., fn, ...)` naming a module-level def, or a def
    decorated with a call of `impl`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "impl":
        for a in node.args:
            if isinstance(a, ast.Name) and a.id in defs:
                yield node, defs[a.id]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for d in node.decorator_list:
            if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "impl":
                yield d, node


def _first(fn) -> int:
    """A function's code's first line: its first decorator's, else its `def`."""
    return min([d.lineno for d in fn.decorator_list] + [fn.lineno])
