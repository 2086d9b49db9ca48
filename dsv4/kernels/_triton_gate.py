"""The learned MoE gate after its GEMV in one Triton launch: scores, biased top-k, normalized weights.

In a decode step the gate's logits become routing weights through three launches (inductor's
sqrt(softplus) + bias, the top-k kernel, inductor's gather and normalization: session 16's listing).
Here one program per token row holds the row of E <= MAX_E logits in registers:

    s = sqrt(softplus(logits)) (fp32; softplus = x above 20, else log1p(exp(x)), as torch's, from Triton's
    exp and log: within a few fp32 ulp of torch's);
    the k largest of s + bias by rank (larger values, or equal ones at lower indices, before it),
    so ties go to the lowest indices and the picks come out in index order (the top-k kernel's rule);
    weights = s at the picks / their sum * route_scale (IEEE division, as torch's).

What differs from the torch path is the order of the k-term sum and the last bits of exp and log.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4 import kernels
from dsv4.kernels._pdl import launch_args, pdl_wait

MAX_E = kernels.GATE_MAX_E  # experts per row held as one [E, E] comparison


@triton.jit
def _log1p(u):
    """log(1 + u) for u >= 0 to a few ulp from tl.log (Goldberg: log(1 + u) * u / ((1 + u) - 1), or u where
    1 + u rounds to 1); libdevice's log1p has no interpreter twin to test against."""
    v = 1.0 + u
    return tl.where(v == 1.0, u, tl.log(v) * (u / (v - 1.0)))


@triton.jit(do_not_specialize=["k"])
def _gate_kernel(l_ptr, b_ptr, w_ptr, i_ptr, E, k, route_scale, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < E
    x = tl.load(l_ptr + row * E + offs, mask=ok, other=0.0)
    s = tl.sqrt_rn(tl.where(x > 20.0, x, _log1p(tl.exp(x))))
    key = tl.where(ok, s + tl.load(b_ptr + offs, mask=ok, other=0.0), float("-inf"))
    ki = key[:, None]
    kj = key[None, :]
    before = ((kj > ki) | ((kj == ki) & (offs[None, :] < offs[:, None]))) & ok[None, :]
    sel = (tl.sum(before.to(tl.int32), axis=1) < k) & ok
    total = tl.sum(tl.where(sel, s, 0.0), axis=0)
    w = tl.fdiv(s, total, ieee_rounding=True) * route_scale
    slot = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    tl.store(w_ptr + row * k + slot, w, mask=sel)
    tl.store(i_ptr + row * k + slot, offs.to(tl.int64), mask=sel)


def applies(logits: torch.Tensor, bias: torch.Tensor, k: int) -> bool:
    """fp32 logits [N, E] with E <= MAX_E, an fp32 bias [E], 1 <= k <= E."""
    return (logits.dim() == 2 and logits.dtype == torch.float32 and bias.dtype == torch.float32
            and bias.shape == (logits.shape[1],) and 1 <= k <= logits.shape[1] <= MAX_E)


def moe_gate(logits: torch.Tensor, bias: torch.Tensor, k: int, route_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [N, k] fp32, indices [N, k] int64) of the learned gate, picks in index order; one launch."""
    if not applies(logits, bias, k):
        raise ValueError(f"moe_gate: logits {logits.dtype} {tuple(logits.shape)}, bias {tuple(bias.shape)}, k={k}")
    N, E = logits.shape
    logits = logits.contiguous()
    weights = logits.new_empty((N, k))
    indices = logits.new_empty((N, k), dtype=torch.int64)
    if N == 0:
        return weights, indices
    block = max(16, triton.next_power_of_2(E))
    with torch.cuda.device(logits.device) if logits.is_cuda else contextlib.nullcontext():
        _gate_kernel[(N,)](logits, bias.contiguous(), weights, indices, E, k, route_scale, BLOCK=block,
                           num_warps=1 if block <= 64 else 4, **launch_args(logits))
    return weights, indices
