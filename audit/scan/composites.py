"""Composite ops torch hands the tracer whole: traced as the ops they are made of.

Outside inference mode, torch's autograd key runs a CompositeImplicitAutograd op's decomposition before
the Python dispatch key is reached, so the tracer records the parts (`torch.where(cond)` is `nonzero`,
`t.item()` is `_local_scalar_dense`, `torch.linalg.inv` ends in `_linalg_check_errors`) and the rules key
on those. Under `torch.inference_mode()` (inference code decorates its forward with it), or on inference
tensors, the autograd keys are skipped and the composite itself reaches the tracer's mode: the `nonzero`
inside `torch.where(cond)` was never seen. The tracer runs the composite's own decomposition under its
mode instead, so a step traces the same ops in either mode.
"""

from __future__ import annotations

import torch

_KEY = torch._C.DispatchKey.CompositeImplicitAutograd
_WHOLE: dict = {}  # OpOverload -> its decomposition, or None


def parts(func, types=()):
    """The callable that runs `func` as its parts (its CompositeImplicitAutograd kernel) for an aten op
    torch would otherwise decompose before tracing; None for any other op, and for an op on a tensor
    subclass (its own `__torch_dispatch__` decides what a composite is made of)."""
    if any(t is not torch.Tensor for t in types):
        return None
    if func in _WHOLE:
        return _WHOLE[func]
    fn = None
    if isinstance(func, torch._ops.OpOverload) and func.namespace == "aten":
        try:
            if func.has_kernel_for_dispatch_key(_KEY):
                fn = func.decompose
        except (RuntimeError, AttributeError):  # an overload torch cannot query
            fn = None
    _WHOLE[func] = fn
    return fn
