"""A compressor's entry finished in one Triton launch: model dtype, RMSNorm, RoPE, rounding, cache write.

`Compressor.finish` then `write_slot` in the graph-ready step (dsv4/decode/static_attention.py) are,
under inductor on the H200, ~8 small kernels per compressor and step (the cast and the norm's
reduction, the norm and RoPE, the RoPE's cat, the rounding's amax and its rounding, the masked read of
the old row and the slot write; session 11's listing). Here one program per batch row holds the
pooled entry [hd] in registers and does all of it, in the reference's order of roundings:

    x = bf16(pooled); y = bf16((x * rsqrt(mean(x^2) + eps)) * w); the last rd features rotated at the
    block's position (pairs (2i, 2i+1), fp32, then bf16); then the layer's rounding:
    "kv": the first hd - rd features rounded to e4m3 with a UE8M0 scale per 64 (fp8_fake_quant), the
    RoPE features kept; "index" (the indexer's keys): the Walsh-Hadamard rotation over hd (butterflies
    in fp32, in the reference's order, times hd^-1/2, then bf16), then e2m1 with a UE8M0 scale per 32;

and stores the row into the cache slot pos // m only when the token completes its block (the old row
stays otherwise: what write_slot's keep does). What differs from the torch path is fp32 summation
order in the mean and the approximate rsqrt.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4.kernels._pdl import launch_args, pdl_wait
from dsv4.kernels._triton_fp8 import _round_e4m3

KV_BLOCK = 64  # the KV rounding's scale block (released: UE8M0 per 64 features)
INDEX_BLOCK = 32  # the indexer keys' FP4 scale block (UE8M0 per 32)
ROUNDINGS = {"none": 0, "kv": 1, "index": 2}


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
    amax = tl.fdiv(tl.maximum(tl.max(tl.abs(yb), axis=1), 1e-4), 448.0, ieee_rounding=True)  # div.rn, not div.full
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # the scale's biased exponent
    scale = (e << 23).to(tl.float32, bitcast=True)
    inv = ((254 - e) << 23).to(tl.float32, bitcast=True)
    q = _round_e4m3(tl.clamp(yb * inv[:, None], -448.0, 448.0)) * scale[:, None]
    return tl.where(c < NOPE, tl.reshape(q, (BLOCK,)), y)


@triton.jit
def _hadamard(y, BLOCK: tl.constexpr, LOG: tl.constexpr):
    """The Walsh-Hadamard butterflies of y [BLOCK] (BLOCK = 2^LOG) as dsv4/ops/quantize.hadamard runs them:
    at stride h, pairs (j, j + h) in each 2h group become (a + b, a - b), fp32; unscaled."""
    for i in tl.static_range(LOG):  # stride 1 << i (no named constexpr: the compiler refuses to rebind one)
        a, b = tl.split(tl.permute(tl.reshape(y, (BLOCK >> (i + 1), 2, 1 << i)), (0, 2, 1)))
        y = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), (BLOCK,))
    return y


@triton.jit
def _round_e2m1(y, BLOCK: tl.constexpr, IB: tl.constexpr):
    """y rounded as fp4_fake_quant(., IB): per IB block a UE8M0 scale s = 2^ceil(log2(max(amax, 1e-10) / 6)),
    y / s to the nearest e2m1 value (ties to even; spacing 0.5 below 2, 1 below 4, 2 above; 6 at most),
    times s; a value that rounds to zero is +0 as the reference's codes give."""
    yb = tl.reshape(y, (BLOCK // IB, IB))
    amax = tl.fdiv(tl.maximum(tl.max(tl.abs(yb), axis=1), 1e-10), 6.0, ieee_rounding=True)
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    scale = (e << 23).to(tl.float32, bitcast=True)
    v = yb * ((254 - e) << 23).to(tl.float32, bitcast=True)[:, None]  # / scale, exactly (a power of two)
    a = tl.minimum(tl.abs(v), 6.0)
    step = tl.where(a < 2.0, 0.5, tl.where(a < 4.0, 1.0, 2.0))
    k = ((a * tl.where(a < 2.0, 2.0, tl.where(a < 4.0, 1.0, 0.5))) + 12582912.0) - 12582912.0  # a / step to the
    mag = k * step  # nearest integer, ties to even (1.5 * 2^23)
    q = tl.where((v < 0) & (k > 0), -mag, mag) * scale[:, None]
    return tl.reshape(q, (BLOCK,))


@triton.jit
def _finish(x, c, ok, w_ptr, cos_ptr, sin_ptr, HD, eps, dt: tl.constexpr, RD: tl.constexpr, ROUND: tl.constexpr,
            BLOCK: tl.constexpr, LOG: tl.constexpr, KB: tl.constexpr, IB: tl.constexpr, HSCALE: tl.constexpr):
    """Compressor.finish of one pooled row x [BLOCK] fp32 (features c < HD): model dtype, RMSNorm, RoPE,
    the rounding (ROUND: 0 none, 1 kv, 2 index) -> fp32 of model-dtype values."""
    x = x.to(dt).to(tl.float32)
    r = tl.math.rsqrt(tl.sum(x * x, axis=0) / HD + eps)
    w = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    y = ((x * r) * w).to(dt).to(tl.float32)
    y = _rope(y, cos_ptr, sin_ptr, c, HD, RD, BLOCK).to(dt).to(tl.float32)
    if ROUND == 1:
        y = _round_kv(y, c, HD - RD, BLOCK, KB)
    if ROUND == 2:  # HD == BLOCK here (applies)
        y = (_hadamard(y, BLOCK, LOG) * HSCALE).to(dt).to(tl.float32)
        y = _round_e2m1(y, BLOCK, IB)
    return y


@triton.jit
def _entry_kernel(p_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, HD, eps, spb, sob, sos,
                  M: tl.constexpr, RD: tl.constexpr, ROUND: tl.constexpr, BLOCK: tl.constexpr, LOG: tl.constexpr,
                  KB: tl.constexpr, IB: tl.constexpr, HSCALE: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    b = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    ok = c < HD
    dt: tl.constexpr = out_ptr.dtype.element_ty
    pos = tl.load(pos_ptr)
    x = tl.load(p_ptr + b * spb + c, mask=ok, other=0.0)
    y = _finish(x, c, ok, w_ptr, cos_ptr, sin_ptr, HD, eps, dt, RD, ROUND, BLOCK, LOG, KB, IB, HSCALE)
    done = (c * 0 + pos + 1) % M == 0  # block-shaped (Triton 3.9's interpreter rejects a scalar mask term)
    tl.store(out_ptr + b * sob + (pos // M) * sos + c, y.to(dt), mask=ok & done)


def finish_args(hd: int, rd: int, rounding: str) -> dict:
    """The compile-time arguments of _finish for a row of hd features."""
    block = max(triton.next_power_of_2(hd), KV_BLOCK)
    return dict(RD=rd, ROUND=ROUNDINGS[rounding], BLOCK=block, LOG=block.bit_length() - 1, KB=KV_BLOCK,
                IB=INDEX_BLOCK, HSCALE=hd ** -0.5)


def applies(pooled: torch.Tensor, out: torch.Tensor, rope_dim: int, rounding: str) -> bool:
    """The kernel's cases: fp32 pooled [B, hd] and what the finish takes (finishes)."""
    return pooled.dim() == 2 and finishes(pooled.shape[0], pooled.shape[1], out, rope_dim, rounding)


def finishes(B: int, hd: int, out: torch.Tensor, rope_dim: int, rounding: str) -> bool:
    """Whether _finish takes B rows of hd features into `out`: a bf16 or fp32 cache [B, n, hd] with
    contiguous rows, an even RoPE width; with the KV rounding whole 64-blocks before the RoPE
    features, with the index rounding a power-of-two hd of whole 32-blocks."""
    return (out.dim() == 3 and out.shape[0] == B and out.shape[2] == hd
            and out.dtype in (torch.bfloat16, torch.float32) and out.stride(2) == 1 and rope_dim % 2 == 0
            and 0 < rope_dim <= hd and rounding in ROUNDINGS
            and (rounding != "kv" or (hd - rope_dim) % KV_BLOCK == 0)
            and (rounding != "index" or (hd & (hd - 1) == 0 and hd % INDEX_BLOCK == 0)))


def compress_entry(pooled: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   pos: torch.Tensor, out: torch.Tensor, ratio: int, eps: float, rounding: str) -> None:
    """Compressor.finish(pooled) written into out[:, pos // ratio] when (pos + 1) % ratio == 0, in one
    launch (cos, sin: the RoPE angles of the block's position, [rd / 2] fp32)."""
    rd = 2 * cos.numel()
    if not applies(pooled, out, rd, rounding) or sin.numel() != cos.numel():
        raise ValueError(f"compress_entry: pooled {tuple(pooled.shape)}, out {tuple(out.shape)} {out.dtype}, "
                         f"rd {rd}, rounding {rounding!r}")
    B, hd = pooled.shape
    pooled = pooled.float() if pooled.stride(-1) == 1 else pooled.float().contiguous()
    with torch.cuda.device(out.device) if out.is_cuda else contextlib.nullcontext():
        _entry_kernel[(B,)](pooled, weight.contiguous(), cos.float().contiguous(), sin.float().contiguous(), pos, out,
                            hd, eps, pooled.stride(0), out.stride(0), out.stride(1), M=ratio,
                            **finish_args(hd, rd, rounding), num_warps=4, **launch_args(out))
