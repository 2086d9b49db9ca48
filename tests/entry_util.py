"""How close a compressor kernel's cache rows must be to its twin's (CPU interpreter and GPU tests)."""

from __future__ import annotations

import torch


def close_entries(a: torch.Tensor, b: torch.Tensor, rounding: str, where) -> None:
    """Cache rows a (the twin's) and b (the kernel's) equal up to rare one-step moves of the rounding: the
    fp32 sum orders (the norm's mean, the pooling) can put a value across a rounding boundary now and
    then: one e4m3 step (2^-3), or after the Hadamard one e2m1 step of the block's grid (2 scales), or
    without rounding two bf16 steps; fp32 rows within 4e-6 of each row's largest."""
    from dsv4.ops.quantize import ue8m0_scale

    af, bf = a.float(), b.float()
    if a.dtype == torch.float32:
        err = ((af - bf).abs().amax(-1) / af.abs().amax(-1).clamp(min=1e-30)).max().item()
        assert err <= 4e-6, (where, err)
        return
    if rounding == "index":
        blocks = af.unflatten(-1, (-1, 32))
        tol = (2 * ue8m0_scale(blocks.abs().amax(-1, keepdim=True), 6.0, 1e-10)).expand_as(blocks).flatten(-2)
    else:
        tol = af.abs() * (2 ** -3 if rounding == "kv" else 2 ** -6)
    assert ((af - bf).abs() <= tol).all(), (where, (af - bf).abs().max())
    assert (a != b).float().mean().item() <= 0.02, (where, (a != b).float().mean())
