"""Python decompositions torch ships as ops of their own (`quantized_decomposed::quantize_per_tensor.tensor`,
the PT2E reference quantization ops): registered with `Library.impl(..., "CompositeExplicitAutograd")` in one of
torch's own Python modules, they run that Python on every call, on every device.

The dispatch mode sees such an op as one op, and torch's code is hidden, so the ops inside would go
unrecorded: a `scale.item()` passed on as a Python float into `input * (1.0 / scale)` bakes a host value a
GPU's graph keeps. The tracer runs their kernel with the mode active, as it does a target's custom op
(custom_ops.python_body); what it runs is reported at the target's call of the op. Kernels torch's op
machinery registers for it (`torch/library.py`, `torch/_library/`: `custom_op`s such as `rngprims`), and
device-specific kernels (FSDP's copy-in, symmetric memory: CPU or CUDA keys), stay opaque.
"""

from __future__ import annotations

import functools
import os
import re

import torch

_KERNEL = re.compile(r"^CompositeExplicitAutograd(?:\[alias\])?: registered at (.+\.py):\d+", re.M)
_TORCH = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_MACHINERY = (os.path.join(_TORCH, "library.py"), os.path.join(_TORCH, "_library") + os.sep)


@functools.lru_cache(maxsize=None)
def is_torch_decomposition(name: str) -> bool:
    """Whether op `name` has a CompositeExplicitAutograd kernel written in Python in one of torch's own
    modules (not its op-registration machinery)."""
    try:
        dump = torch._C._dispatch_dump(name)
    except RuntimeError:
        return False
    for f in _KERNEL.findall(dump):
        f = os.path.realpath(f)
        if f.startswith(_TORCH) and not f.startswith(_MACHINERY):
            return True
    return False
