"""A compressor's entry finished in one Triton launch: model dtype, RMSNorm, RoPE, KV rounding, cache write.

`Compressor.finish` then `write_slot` in the graph-ready step (dsv4/decode/static_attention.py) are,
under inductor on the H200, ~8 small kernels per compressor and step (the cast and the norm's
reduction, the norm and RoPE, the RoPE's cat, the rounding's amax and its rounding, the masked read of
the old row and the slot write; session 11's listing). Here one program per batch row holds the
pooled entry [hd] in registers and does all of it, in the reference's order of roundings:

    x = bf16(pooled); y = bf16((x * rsqrt(mean(x^2) + eps)) * w); the last rd features rotated at the
    block's position (pairs (2i, 2i+1), fp32, then bf16); with KV rounding the first hd - rd features
    rounded to e4m3 with a UE8M0 scale per 64 (fp8_fake_quant), the RoPE features kept;

and stores the row into the cache slot pos // m only when the token completes its block (the old row
stays otherwise: what write_slot's keep does). The indexer's compressor (Hadamard, then FP4) keeps the
torch path. What differs from it is fp32 summation order in the mean and the approximate rsqrt.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4.kernels._pdl import launch_args, pdl_wait
from dsv4.kernels._triton_fp8 import _round_e4m3

KV_BLOCK = 64  # the KV rounding's scale block (released: UE8M0 per 64 features)


@triton.jit
def _rope(y, cos_ptr, sin_ptr, c, HD, RD: tl.constexpr, BLOCK: tl.constexpr):
    """y [BLOCK] (fp32 of bf16 values) with features [HD - RD, HD) rotated by the angles: pairs (2i, 2i+1)."""
    a, b = tl.split(tl.reshape(y, (BLOCK // 2, 2)))
    i = (2 * tl.arange(0, BLOCK // 2) - (HD - RD)) // 2
    on = (i >= 0) & (i < RD // 2)
    cs = tl.load(cos_ptr + i, mask=on, other=1.0)
    sn = tl.load(sin_ptr + i, mask=on, other=0.0)
    rot = tl.reshape(tl.join(a * cs - b * sn, a * sn + b * cs), (BLOCK,))
    return tl.where(c >= HD - RD, rot, y)


@triton.jit
def _round_kv(y, c, NOPE, BLOCK: tl.constexpr, KB: tl.constexpr):
    """The first NOPE features of y (a multiple of KB) rounded as fp8_fake_quant(., KB); the rest kept."""
    yb = tl.reshape(y, (BLOCK // KB, KB))
    amax = tl.maximum(tl.max(tl.abs(yb), axis=1), 1e-4) / 448.0
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # the scale's biased exponent
    scale = (e << 23).to(tl.float32, bitcast=True)
    inv = ((254 - e) << 23).to(tl.float32, bitcast=True)
    q = _round_e4m3(tl.clamp(yb * inv[:, None], -448.0, 448.0)) * scale[:, None]
    return tl.where(c < NOPE, tl.reshape(q, (BLOCK,)), y)


@triton.jit
def _entry_kernel(p_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, HD, eps, spb, sob, sos,
                  M: tl.constexpr, RD: tl.constexpr, KV: tl.constexpr, BLOCK: tl.constexpr, KB: tl.constexpr,
                  PDL: tl.constexpr):
    pdl_wait(PDL)
    b = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    ok = c < HD
    dt = out_ptr.dtype.element_ty
    pos = tl.load(pos_ptr)
    x = tl.load(p_ptr + b * spb + c, mask=ok, other=0.0).to(dt).to(tl.float32)
    r = tl.math.rsqrt(tl.sum(x * x, axis=0) / HD + eps)
    w = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    y = ((x * r) * w).to(dt).to(tl.float32)
    y = _rope(y, cos_ptr, sin_ptr, c, HD, RD, BLOCK).to(dt).to(tl.float32)
    if KV:
        y = _round_kv(y, c, HD - RD, BLOCK, KB)
    done = (pos + 1) % M == 0
    tl.store(out_ptr + b * sob + (pos // M) * sos + c, y.to(dt), mask=ok & done)


def applies(pooled: torch.Tensor, out: torch.Tensor, rope_dim: int, kv_round: bool) -> bool:
    """The kernel's cases: fp32 pooled [B, hd], a bf16 or fp32 cache [B, n, hd] with contiguous rows,
    an even RoPE width, and with KV rounding whole 64-blocks before the RoPE features."""
    hd = pooled.shape[-1]
    return (pooled.dim() == 2 and out.dim() == 3 and out.shape[0] == pooled.shape[0] and out.shape[2] == hd
            and out.dtype in (torch.bfloat16, torch.float32) and out.stride(2) == 1 and rope_dim % 2 == 0
            and 0 < rope_dim <= hd and (not kv_round or (hd - rope_dim) % KV_BLOCK == 0))


def compress_entry(pooled: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   pos: torch.Tensor, out: torch.Tensor, ratio: int, eps: float, kv_round: bool) -> None:
    """Compressor.finish(pooled) written into out[:, pos // ratio] when (pos + 1) % ratio == 0, in one
    launch (cos, sin: the RoPE angles of the block's position, [rd / 2] fp32)."""
    rd = 2 * cos.numel()
    if not applies(pooled, out, rd, kv_round) or sin.numel() != cos.numel():
        raise ValueError(f"compress_entry: pooled {tuple(pooled.shape)}, out {tuple(out.shape)} {out.dtype}, rd {rd}")
    B, hd = pooled.shape
    pooled = pooled.float() if pooled.stride(-1) == 1 else pooled.float().contiguous()
    block = max(triton.next_power_of_2(hd), KV_BLOCK)
    with torch.cuda.device(out.device) if out.is_cuda else contextlib.nullcontext():
        _entry_kernel[(B,)](pooled, weight.contiguous(), cos.float().contiguous(), sin.float().contiguous(), pos, out,
                            hd, eps, pooled.stride(0), out.stride(0), out.stride(1), M=ratio, RD=rd, KV=kv_round,
                            BLOCK=block, KB=KV_BLOCK, num_warps=4, **launch_args(out))
