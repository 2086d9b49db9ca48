"""The mHC Sinkhorn normalization as one Triton kernel: each token's hc x hc matrix stays in registers.

Under inductor each of the 39 normalizations of a site becomes its own kernel (every one reads
whole rows or columns of the previous), ~3,160 launches of a flash-h200 decode step. Here one
program holds BLOCK_T tokens' matrices for all iterations: one launch per site. Same operations
and order of rounds as dsv4/ops/sinkhorn.py; only the 4-term sums may associate differently.
hc is padded to a power of two with zeros, which stay zero through every division.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4.kernels._pdl import launch_args, pdl_wait

BLOCK_T = 32  # tokens per program at most; a decode batch is one program


def block_t(T: int) -> int:
    """Tokens per program: the batch rounded up to a power of two, at most BLOCK_T. A 1-token step in a
    32-token block did 32x the divisions of its 20 rounds (~10 us per site on the H200)."""
    return min(BLOCK_T, triton.next_power_of_2(max(T, 1)))


@triton.jit
def _normalize(z, mask, iters, eps):
    """Sinkhorn of logits z [BLOCK_T, HP, HP] (-inf where masked): softmax rows + eps, columns, then
    iters - 1 rounds of rows and columns, as dsv4/ops/sinkhorn.py runs them."""
    m = tl.max(z, axis=2)
    m = tl.where(m == float("-inf"), 0.0, m)  # padded rows: keep them finite
    e = tl.where(mask, tl.exp(z - m[:, :, None]), 0.0)
    s = tl.sum(e, axis=2)
    c = tl.where(mask, e / tl.where(s == 0.0, 1.0, s)[:, :, None] + eps, 0.0)
    c = c / (tl.sum(c, axis=1)[:, None, :] + eps)
    for _ in range(iters - 1):
        c = c / (tl.sum(c, axis=2)[:, :, None] + eps)
        c = c / (tl.sum(c, axis=1)[:, None, :] + eps)
    return c


@triton.jit
def _sinkhorn_kernel(x_ptr, y_ptr, T, iters, eps, HC: tl.constexpr, HP: tl.constexpr, BLOCK_T: tl.constexpr,
                     PDL: tl.constexpr):
    pdl_wait(PDL)
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ri = tl.arange(0, HP)
    rj = tl.arange(0, HP)
    mask = (rt[:, None, None] < T) & (ri[None, :, None] < HC) & (rj[None, None, :] < HC)
    offs = rt[:, None, None] * (HC * HC) + ri[None, :, None] * HC + rj[None, None, :]
    z = tl.load(x_ptr + offs, mask=mask, other=float("-inf"))
    tl.store(y_ptr + offs, _normalize(z, mask, iters, eps), mask=mask)


@triton.jit
def _comb_kernel(s_ptr, scale_ptr, base_ptr, y_ptr, T, K, norm_eps, iters, eps, HC: tl.constexpr,
                 HP: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr):
    """comb straight from the mixes kernel's sums [T, J + 1] (J = 2 hc + hc^2; column J the sum of squares):
    logits = (sums * rsqrt(sum_sq / K + norm_eps)) * scale[2] + base, as mhc.hc_mixes and sinkhorn_split."""
    pdl_wait(PDL)
    J: tl.constexpr = 2 * HC + HC * HC
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ri = tl.arange(0, HP)
    rj = tl.arange(0, HP)
    mask = (rt[:, None, None] < T) & (ri[None, :, None] < HC) & (rj[None, None, :] < HC)
    col = 2 * HC + ri[None, :, None] * HC + rj[None, None, :]
    r = tl.math.rsqrt(tl.load(s_ptr + rt * (J + 1) + J, mask=rt < T, other=1.0) / K + norm_eps)
    mixes = tl.load(s_ptr + rt[:, None, None] * (J + 1) + col, mask=mask, other=0.0) * r[:, None, None]
    z = mixes * tl.load(scale_ptr + 2) + tl.load(base_ptr + col, mask=mask, other=0.0)
    z = tl.where(mask, z, float("-inf"))
    offs = rt[:, None, None] * (HC * HC) + ri[None, :, None] * HC + rj[None, None, :]
    tl.store(y_ptr + offs, _normalize(z, mask, iters, eps), mask=mask)


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """logits [T, hc, hc] fp32 -> comb [T, hc, hc] fp32 on the current stream."""
    T, hc, hc2 = logits.shape
    if hc != hc2 or logits.dtype != torch.float32:
        raise ValueError(f"sinkhorn: logits {logits.dtype} {tuple(logits.shape)}")
    x = logits.contiguous()
    y = torch.empty_like(x)
    bt = block_t(T)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _sinkhorn_kernel[(triton.cdiv(T, bt),)](x, y, T, iters, eps, HC=hc, HP=triton.next_power_of_2(hc), BLOCK_T=bt,
                               num_warps=1, **launch_args(x))
    return y


def comb(sums: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, K: int, norm_eps: float, hc: int, iters: int,
         eps: float) -> torch.Tensor:
    """The mixes kernel's sums [T, 2 hc + hc^2 + 1] fp32 -> comb [T, hc, hc] fp32, one launch (the RMS scale,
    scale[2] and base applied in the kernel, then the Sinkhorn)."""
    T, J1 = sums.shape
    if J1 != 2 * hc + hc * hc + 1 or sums.dtype != torch.float32 or scale.numel() != 3 or base.numel() != J1 - 1:
        raise ValueError(f"comb: sums {sums.dtype} {tuple(sums.shape)}, hc {hc}")
    s = sums.contiguous()
    y = torch.empty(T, hc, hc, dtype=torch.float32, device=s.device)
    bt = block_t(T)
    with torch.cuda.device(s.device) if s.is_cuda else contextlib.nullcontext():
        _comb_kernel[(triton.cdiv(T, bt),)](s, scale.float().contiguous(), base.float().contiguous(), y, T, K,
                                             norm_eps, iters, eps, HC=hc, HP=triton.next_power_of_2(hc),
                                             BLOCK_T=bt, num_warps=1, **launch_args(s))
    return y
