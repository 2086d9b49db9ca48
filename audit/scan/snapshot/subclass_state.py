"""Python state a module keeps inside its weights: tensor subclasses defined outside torch.

A quantized weight is a tensor subclass (torchao's AffineQuantizedTensor, a bitsandbytes Params4bit, a float8
weight) that holds Python state of its own: its inner tensors, a `quant_state` dataclass, an input quantizer
object, flags. Such a weight sits in the module's parameter (or buffer) table, which the state snapshot does not
walk for plain tensors. A step that changes that state (a dispatch counting calls in the weight's QuantState, a
float8 linear rebinding the weight's `inv_scale`) changes it once under capture and never in a replay, so those
weights are followed as objects: their attributes are state, their tensor attributes are held tensors.
torch's own subclasses (FakeTensor, DTensor, a plain Parameter) are not: their attributes are torch's business.
"""

from __future__ import annotations

import torch
from torch import nn

from audit.scan.snapshot.own_dict import own_dict

__all__ = ["held_weights"]

_TORCH = ("torch",)


def held_weights(mod: nn.Module):
    """(name, tensor) for the parameters and buffers of `mod` that are instances of a tensor subclass
    defined outside torch with Python attributes of their own."""
    for table in (mod._parameters, mod._buffers):
        for name, t in list(table.items()):
            if _python_subclass(t):
                yield name, t


def _python_subclass(t) -> bool:
    if not isinstance(t, torch.Tensor) or type(t) in (torch.Tensor, nn.Parameter, nn.Buffer):
        return False
    mod = getattr(type(t), "__module__", "") or ""
    return mod.split(".")[0] not in _TORCH and bool(own_dict(t))
