"""Composite ops torch hands the tracer whole: traced as the ops they are made of.

Outside inference mode, torch's autograd key runs a CompositeImplicitAutograd op's decomposition before
the Python dispatch key is reached, so the tracer records the parts (`torch.where(cond)` is `nonzero`,
`t.item()` is `_local_scalar_dense`, `torch.linalg.inv` ends in `_linalg_check_errors`) and the rules key
on those. Under `torch.inference_mode()` (inference code decorates its forward with it), or on inference
tensors, the autograd keys are skipped and the composite itself reaches the tracer's mode: the `nonzero`
inside `torch.where(cond)` was never seen. The tracer runs the composite's own decomposition under its
mode instead, so a step traces the same ops in either mode.

A composite on a nested tensor (`torch.nested.as_nested_tensor(pieces)`, the strided layout torch's NJT attention
falls back to) reaches the mode whole in any mode: its nested kernel (`matmul_nested`) runs instead of the
decomposition, which has no sizes for a ragged dimension. It is traced as the one op it is.
"""

from __future__ import annotations

import torch

_KEY = torch._C.DispatchKey.CompositeImplicitAutograd
_WHOLE: dict = {}  # OpOverload -> its decomposition, or None


def _nested(args) -> bool:
    """A nested tensor among the op's arguments (or in a list of them)."""
    for a in args:
        if isinstance(a, (list, tuple)) and _nested(a) or isinstance(a, torch.Tensor) and a.is_nested:
            return True
    return False


def parts(func, types=(), args=()):
    """The callable that runs `func` as its parts (its CompositeImplicitAutograd kernel) for an aten op
    torch would otherwise decompose before tracing; None for any other op, for an op on a tensor
    subclass (its own `__torch_dispatch__` decides what a composite is made of), and for one on a
    nested tensor (its nested kernel runs)."""
    if any(t is not torch.Tensor for t in types):
        return None
    if func in _WHOLE:
        return None if _WHOLE[func] is not None and _nested(args) else _WHOLE[func]
    fn = None
    if isinstance(func, torch._ops.OpOverload) and func.namespace == "aten":
        try:
            if func.has_kernel_for_dispatch_key(_KEY):
                fn = func.decompose
        except (RuntimeError, AttributeError):  # an overload torch cannot query
            fn = None
    _WHOLE[func] = fn
    return None if fn is not None and _nested(args) else fn
