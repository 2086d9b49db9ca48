"""The Python body of a `torch.library.custom_op` the step calls.

The dispatch mode sees a custom op as one op (`mylib.route`): torch runs its Python body below the
mode, so the ops inside (a `nonzero`, an allocation kept in state) would go unrecorded. The tracer
runs that body itself, with the mode active, so its ops are recorded at the body's lines, with the
target's call as caller. Torch's own custom ops (prims, inductor helpers) stay opaque.
"""

from __future__ import annotations

import torch

from audit.scan.user_code import HIDDEN, frame_kind


def python_body(func, args, kwargs, roots: tuple[str, ...] = ()):
    """The function torch would run for `func` on these arguments, when it is a custom op defined
    with `torch.library.custom_op` outside torch and the audit; else None."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:  # an older torch: no custom_op registry
        return None
    name = getattr(getattr(func, "_schema", None), "name", None)
    opdef = OPDEFS.get(name) if name else None
    if opdef is None:
        return None
    code = getattr(getattr(opdef, "_init_fn", None), "__code__", None)
    if code is None or frame_kind(code.co_filename, roots) == HIDDEN:
        return None
    fns = getattr(opdef, "_backend_fns", None) or {}  # torch's wrappers of the kernels, per device type
    return fns.get(_device_type(args, kwargs)) or fns.get(None)


def _device_type(args, kwargs) -> str | None:
    """The device type of the first tensor among the arguments (lists included)."""
    for a in (*args, *(kwargs or {}).values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor):
                return t.device.type
    return None
