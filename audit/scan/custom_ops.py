"""The Python body of a custom op the step calls.

The dispatch mode sees a custom op as one op (`mylib.route`): torch runs its Python kernel below the
mode, so the ops inside (a `nonzero`, an allocation kept in state) would go unrecorded. The tracer
runs that kernel itself, with the mode active, so its ops are recorded at the kernel's lines, with the
target's call as caller. Two registrations have a Python kernel: `torch.library.custom_op` (found in
torch's registry of them) and `torch.library.Library(...).impl(name, fn, key)` (found from where the
dispatcher says the kernel was registered: a .py file). Torch's own ops and C++ kernels stay opaque, except
the Python decompositions torch registers as ops of their own (torch_decomps: `quantized_decomposed::*`).
A tensor subclass's Python `__torch_dispatch__` (a quantized weight that dequantizes on every use) is such
a body too: torch calls it below the mode, so the ops it runs on its inner tensors would go unrecorded.
"""

from __future__ import annotations

import functools
import re

import torch

from audit.scan import torch_decomps
from audit.scan.standins import cpu_kernels
from audit.scan.sources.user_code import HIDDEN, frame_kind

_KERNEL = re.compile(r"^(\w+)(?:\[alias\])?: registered at (.+\.py):\d+", re.M)
_BODY_KEYS = ("CompositeExplicitAutograd", "CPU", "CUDA")  # what a redispatch to the device key reaches


def python_body(func, args, kwargs, roots: tuple[str, ...] = (), types=()):
    """A callable that runs the Python kernel torch would run for `func` on these arguments, when one
    outside torch and the audit is registered for it (or a tensor subclass among `types` handles it in
    its own `__torch_dispatch__`); else None."""
    if (sub := subclass_body(func, types, roots)) is not None:
        return sub
    name = getattr(getattr(func, "_schema", None), "name", None)
    if not name or name.startswith(("aten::", "prims::")):
        return None
    opdef = _custom_op_def(name)
    if opdef is not None:
        code = getattr(getattr(opdef, "_init_fn", None), "__code__", None)
        if code is None or frame_kind(code.co_filename, roots) == HIDDEN:
            return None
        fns = getattr(opdef, "_backend_fns", None) or {}  # the kernels, per device type (None: any device)
        dev = _device_type(args, kwargs)
        cpu_kernels.note_custom_op(name, fns, dev)  # a CPU-only kernel: what it traces a GPU never runs
        return fns.get(dev) or fns.get(None)
    dev = _device_type(args, kwargs)
    if dev is None or not (_python_kernel(name, roots) or torch_decomps.is_torch_decomposition(name)):
        return None
    if dev == "cpu":
        cpu_kernels.note_library(name, torch._C._dispatch_dump(name))
    key = getattr(torch._C.DispatchKey, torch._C._dispatch_key_for_device(dev), None)
    return functools.partial(func.redispatch, torch._C.DispatchKeySet(key)) if key is not None else None


def subclass_body(func, types, roots: tuple[str, ...] = ()):
    """`cls.__torch_dispatch__` called on `func`, `types` and the arguments, for the first tensor subclass among `types`
    whose `__torch_dispatch__` is Python code outside torch and the audit (a library's or the target's);
    else None. Torch's own subclasses (FakeTensor, FunctionalTensor) stay opaque."""
    for cls in types:
        if cls is torch.Tensor or not isinstance(cls, type) or not issubclass(cls, torch.Tensor):
            continue
        fn = getattr(cls.__dict__.get("__torch_dispatch__", None), "__func__", None)
        if fn is None:  # inherited: the class that defines it decides
            fn = next((getattr(c.__dict__["__torch_dispatch__"], "__func__", None) for c in cls.__mro__
                       if "__torch_dispatch__" in c.__dict__), None)
        code = getattr(fn, "__code__", None)
        if code is None or frame_kind(code.co_filename, roots) == HIDDEN:
            continue
        return lambda *a, _cls=cls, **k: _cls.__torch_dispatch__(func, types, a, k)
    return None


def _custom_op_def(name: str):
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:  # an older torch: no custom_op registry
        return None
    return OPDEFS.get(name)


@functools.lru_cache(maxsize=None)
def _python_kernel(name: str, roots: tuple[str, ...]) -> bool:
    """Whether the dispatcher's kernel of op `name` for a device key was registered from a .py file
    outside torch and the audit (`Library.impl`)."""
    try:
        dump = torch._C._dispatch_dump(name)
    except RuntimeError:
        return False
    return any(k in _BODY_KEYS and frame_kind(f, roots) != HIDDEN for k, f in _KERNEL.findall(dump))


def _device_type(args, kwargs) -> str | None:
    """The device type of the first tensor among the arguments (lists included)."""
    for a in (*args, *(kwargs or {}).values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor):
                return t.device.type
    return None
