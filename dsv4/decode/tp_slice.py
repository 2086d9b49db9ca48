"""A Linear's stored tensors sliced along output rows or input columns, in the released format.

A tensor-parallel rank keeps rows [a, b) of a column-parallel projection (wq_b, wo_a, the shared
expert's w1/w3) or columns [a, b) of a row-parallel one (wo_b, the shared w2), without ever
dequantizing: the slice must not cut a scale block, or its scales could not be sliced with it.
FP8 has one UE8M0 scale per 128x128 block; packed FP4 one per 1x32, NVFP4 one per 1x16 (plus a
per-tensor global scale, kept whole). In bfloat16 mode every quantized projection also rounds its
input in 128-blocks along the columns, so a column slice must not cut an activation block either:
a rank cannot know the amax of columns another rank holds.

Every kept tensor is cloned, so the full one is freed: the point of sharding is that a rank holds
less memory, not a view of everything.
"""

from __future__ import annotations

import torch
from torch import nn

from dsv4.errors import DSV4Error
from dsv4.layers.linear import Linear

__all__ = ["alignment", "check_slice", "slice_linear_"]

# per format and tensor: (row step, column step) of one stored element; None = not sliced (a scalar)
_STEP = {
    "bf16": {"weight": (1, 1)},
    "fp8": {"weight": (1, 1), "scale": (128, 128)},
    "fp4": {"weight": (1, 2), "scale": (1, 32)},
    "nvfp4": {"weight": (1, 2), "scale": (1, 16), "global_scale": None},
}
ACT_BLOCK = 128  # bfloat16 mode: the released dynamic activation quantization block


def alignment(fmt: str, dim: int, simulate_quant: bool) -> int:
    """The step a slice boundary along `dim` (0 rows, 1 columns) must be a multiple of."""
    step = max(s[dim] for s in _STEP[fmt].values() if s is not None)
    if dim == 1 and simulate_quant and fmt != "bf16":
        step = max(step, ACT_BLOCK)
    return step


def check_slice(fmt: str, simulate_quant: bool, dim: int, start: int, stop: int, size: int, name: str) -> None:
    """DSV4Error (one line) unless [start, stop) of `size` can be cut out of a `fmt` tensor exactly."""
    step = alignment(fmt, dim, simulate_quant)
    if start % step or (stop % step and stop != size):
        what = ("rows", "columns")[dim]
        why = "input activation blocks" if dim == 1 and step == ACT_BLOCK and fmt != "fp8" else f"{fmt} blocks"
        raise DSV4Error(f"tensor parallel: {name} {what} [{start}, {stop}) of {size} do not fall on {step}-wide "
                        f"{why}; choose a world size that keeps each rank's share a multiple of {step}")


@torch.no_grad()
def slice_linear_(lin: Linear, dim: int, start: int, stop: int, name: str = "linear") -> None:
    """Keeps rows (dim 0) or columns (dim 1) [start, stop) of `lin`, scales included; edits in place."""
    size = (lin.out_features, lin.in_features)[dim]
    if not 0 <= start < stop <= size:
        raise DSV4Error(f"tensor parallel: {name} slice [{start}, {stop}) is outside its {size} "
                        f"{('rows', 'columns')[dim]}")
    check_slice(lin.fmt, lin.simulate_quant, dim, start, stop, size, name)
    for pname, step in _STEP[lin.fmt].items():
        if step is None:
            continue
        t = getattr(lin, pname)
        lo, hi = start // step[dim], -(-stop // step[dim])
        kept = t.narrow(dim, lo, hi - lo).clone()
        setattr(lin, pname, nn.Parameter(kept, requires_grad=False))
    if dim == 0:
        lin.out_features = stop - start
    else:
        lin.in_features = stop - start
