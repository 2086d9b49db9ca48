"""FP8 (e4m3, 128 x 128 UE8M0 block scales) weight GEMM for decode batches of M >= 3 rows, in Triton.

Why: the CuTe FP8 GEMV gives every input row its own pass over the weights, so a batch-16 decode
step's FP8 GEMVs took 12.0 ms on an H200 against 2.2 ms at batch 1 for the same weight bytes. Here
one program holds all rows of the batch (padded to BLOCK_M = 16/32/64) and reads each weight tile
from HBM once, on tensor cores.

Semantics are those of the twin `dsv4.ops.gemv.fp8_gemv_ref`: x [M, K] bf16 (any bf16 values), weight
[N, K] e4m3, scale [ceil(N/128), ceil(K/128)] UE8M0 (float8_e8m0fnu or its uint8 bytes) ->
fp32 [M, N] = x.float() @ dequant(weight).t(); with `groups` G, x is [M*G, K] and output columns
[g*N/G, (g+1)*N/G) read x row m*G + g (wo_a).

Numerics: per BLOCK_K = 128 step (exactly one scale block) the e4m3 tile is widened to bf16 in
registers (exact: every e4m3 value is a bf16 value), one bf16 dot runs into a zero-initialized fp32
partial (bf16 x bf16 products are exact in fp32), and the partial, multiplied by the block's
power-of-two scale (exact), joins the running total with an ordinary fp32 add. Summation across K
blocks never runs in the tensor-core accumulator, which may truncate (Fasi et al. 2021, see
_triton_gemv.py); inside one block the chain is 128 long: ~2e-7 of a row's max |y| at K = 4096 under
the interpreter tests' truncating tensor-core model. (`acc += part * scale` may become an FMA: the
product is exact, so the result is the same.) With quant=True the activation is on the e4m3 grid by
construction, so the dot runs e4m3 x e4m3 (wgmma k32): the weight bytes go to the tensor cores
unconverted and the x block by an exact cast. Products stay exact, but Hopper's FP8 MMA keeps fewer
accumulator bits than fp32 inside its 128-long chain (the DeepSeek-V3 report measured ~14); the
released FP8 GEMM promotes to fp32 per 128 block exactly as here.

The dot is computed as y^T = W x^T ("swap AB"): the weight tile [BLOCK_N, BLOCK_K] is the MMA's
M operand (64/128 rows, what Hopper's wgmma wants) and the few batch rows its N operand (16-64),
so padding rows costs only the N width of the instruction. Compiled ahead of time for sm_90 (Triton 3.9)
at the Flash shapes' tiles this gives wgmma with the weight and x tiles streamed through num_stages
cp.async buffers (16x64 tiles: 40 KB of shared memory; 64x64: 88 KB). Not yet timed on a GPU.

Deterministic: when N gives too few programs, K is split (in whole 128 blocks) and the last split
program of each tile sums the partials in split order inside the kernel (_triton_splitk.py), so graph
replays are bitwise equal to the eager call. Imported lazily (Triton is not needed on CPU machines);
tests/test_triton_fp8_interpret.py runs it under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4.kernels import overrides
from dsv4.kernels._pdl import launch_args, pdl_wait
from dsv4.kernels._triton_gemv import _tile
from dsv4.kernels._triton_splitk import store_tile, workspace

TARGET_PROGRAMS = 264  # ~2 per SM of an H100/H200: enough weight bytes in flight
MAX_BLOCK_M = 64  # rows per program (the decode batch cap); more rows take a grid dim
SCALE_BLOCK = 128
TUNE = overrides.from_env("fp8")  # overrides for a sweep: bn, target, warps, stages (python -m dsv4.kernels.tune)


@triton.jit
def _e8m0(b):
    """UE8M0 byte -> fp32 2^(b-127), built from bits (exact; 0 -> 2^-127 subnormal, 255 -> NaN)."""
    b = b.to(tl.int32)
    bits = tl.where(b == 0, 0x00400000, tl.where(b == 255, 0x7FC00000, b << 23))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _act_round(xt):
    """The released FP8 activation rounding of an x^T tile [128, BLOCK_M] (one block per column):
    -> (the e4m3 values as bf16, each row's UE8M0 scale 2^ceil(log2(max(amax, 1e-4) / 448)) in fp32).
    The scale is built from the fp32 bits as in `ue8m0_scale`; dividing by it is a multiply by its
    exact reciprocal, and e4m3 values are bf16 values, so (values, scale) equals fp8_fake_quant's x."""
    xf = xt.to(tl.float32)
    y = tl.fdiv(tl.maximum(tl.max(tl.abs(xf), axis=0), 1e-4), 448.0, ieee_rounding=True)  # div.rn: `/` is div.full
    bits = y.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # biased exponent of the scale
    scale = (e << 23).to(tl.float32, bitcast=True)
    inv = ((254 - e) << 23).to(tl.float32, bitcast=True)
    v = tl.clamp(xf * inv[None, :], -448.0, 448.0)
    return _round_e4m3(v).to(tl.bfloat16), scale


@triton.jit
def _round_e4m3(v):
    """fp32 values in [-448, 448] -> the nearest e4m3 value (ties to even), as fp32, by arithmetic:
    the grid spacing is 2^(exponent - 3), or 2^-9 below the smallest normal 2^-6, and adding then
    subtracting 1.5 * 2^23 * spacing rounds to a multiple of it in fp32's own round-to-nearest-even.
    (Triton's interpreter converts e4m3 subnormals by truncation; this is one rule on CPU and GPU,
    and the same values as the hardware's cvt.rn.satfinite.)"""
    eb = (v.to(tl.int32, bitcast=True) >> 23) & 0xFF
    magic = (((tl.maximum(eb, 121) - 3 + 23) << 23) | 0x400000).to(tl.float32, bitcast=True)
    return (v + magic) - magic


@triton.jit
def _fp8_gemm_kernel(x_ptr, w_ptr, s_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, K_PER_SPLIT, N_PER_GROUP, G,
                     sxm, swn, ssn, sym, sys,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, QUANT: tl.constexpr,
                     PDL: tl.constexpr):
    pdl_wait(PDL)
    rm, rn, rk, k_begin, k_end, pid_s = _tile(K, K_PER_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K)
    n0 = tl.program_id(0) * BLOCK_N
    xrow = rm * G + n0 // N_PER_GROUP  # the tile lies in one group (the host checks N/G % BLOCK_N == 0)
    s_ptr += (n0 // 128) * ssn  # and in one 128-row scale block (BLOCK_N divides 128)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # y^T tile
    for k0 in range(k_begin, k_end, BLOCK_K):
        kk = k0 + rk
        xt = tl.load(x_ptr + xrow[None, :] * sxm + kk[:, None], mask=(rm[None, :] < M) & (kk[:, None] < k_end),
                     other=0.0)  # x^T [BLOCK_K, BLOCK_M] bf16
        wb = tl.load(w_ptr + rn[:, None] * swn + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < k_end),
                     other=0)  # e4m3 bytes [BLOCK_N, BLOCK_K]
        ws = _e8m0(tl.load(s_ptr + k0 // 128))
        if QUANT:  # the activation block rounded here (its scale joins the weight block's): e4m3 x e4m3
            xq, xs = _act_round(xt)
            w8 = wb.to(tl.float8e4nv, bitcast=True)  # straight from the loaded bytes to the tensor cores
            acc += tl.dot(w8, xq.to(tl.float8e4nv)) * (ws * xs[None, :])  # xq is on the e4m3 grid: exact
        else:  # any bf16 x: the weights widened to bf16 (exact)
            acc += tl.dot(wb.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16), xt) * ws
    store_tile(acc, y_ptr, ws_ptr, cnt_ptr, rm[None, :] * sym + rn[:, None], (rm[None, :] < M) & (rn[:, None] < N),
               tl.num_programs(2), sys)


def tiles(M: int, N: int, K: int, groups: int = 1) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, splits). BLOCK_M: the batch padded to a power of two in [16, 64];
    BLOCK_K = 128 (one scale block per step); BLOCK_N 128 when that still gives TARGET_PROGRAMS programs,
    else 64, and never more than the largest power of two dividing N/G (a tile stays in one group). K is
    split (rounding down) until the grid has ~TARGET_PROGRAMS programs, each split >= 2 K steps."""
    bm = min(max(triton.next_power_of_2(M), 16), MAX_BLOCK_M)
    bk = SCALE_BLOCK
    m_tiles = triton.cdiv(M, bm)
    target = TUNE.get("target", TARGET_PROGRAMS)
    bn = TUNE.get("bn", 128 if triton.cdiv(N, 128) * m_tiles >= target else 64)
    if groups > 1:
        npg = N // groups
        bn = min(bn, npg & -npg)  # largest power of two dividing N/G
    programs = triton.cdiv(N, bn) * m_tiles
    splits = max(1, min(target // programs, triton.cdiv(K, bk) // 2))
    return bm, bn, bk, splits


def fp8_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, groups: int = 1,
             out: torch.Tensor | None = None, quant: bool = False) -> torch.Tensor:
    """x [M*groups, K] bf16, weight [N, K] float8_e4m3fn, scale [ceil(N/128), ceil(K/128)] UE8M0
    (float8_e8m0fnu or uint8) -> fp32 [M, N] on the current stream (see the module docstring).
    quant: x is first rounded as `fp8_fake_quant(x, 128)` does, inside the kernel (K % 128 == 0)."""
    N, K = weight.shape
    if x.dim() != 2 or x.shape[1] != K or x.dtype != torch.bfloat16 or weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8_gemm: x {x.dtype} {tuple(x.shape)}, weight {weight.dtype} {tuple(weight.shape)}")
    if scale.dtype not in (torch.float8_e8m0fnu, torch.uint8) or tuple(scale.shape) != (triton.cdiv(N, 128),
                                                                                      triton.cdiv(K, 128)):
        raise ValueError(f"fp8_gemm: scale {scale.dtype} {tuple(scale.shape)} for weight {tuple(weight.shape)}")
    if groups < 1 or N % groups or x.shape[0] % groups:
        raise ValueError(f"fp8_gemm: groups {groups} for N {N} and {x.shape[0]} x rows")
    M = x.shape[0] // groups
    if quant and K % SCALE_BLOCK:
        raise ValueError(f"fp8_gemm: the activation rounding needs K % {SCALE_BLOCK} == 0, got K = {K}")
    bm, bn, bk, splits = tiles(M, N, K, groups)
    assert groups == 1 or (bn >= 16 and (N // groups) % bn == 0), f"fp8_gemm: N/G = {N // groups}: no 16+ tile"
    if x.stride(1) != 1:
        x = x.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    w8, s8 = weight.view(torch.uint8), scale.view(torch.uint8).contiguous()
    y = out if out is not None else torch.empty(M, N, dtype=torch.float32, device=x.device)
    if y.shape != (M, N) or y.dtype != torch.float32 or y.stride(1) != 1:
        raise ValueError(f"fp8_gemm: out {y.dtype} {tuple(y.shape)} stride {y.stride()}, want fp32 [{M}, {N}]")
    per = triton.cdiv(triton.cdiv(K, bk), splits) * bk  # K per split, whole scale blocks
    splits = triton.cdiv(K, per)
    grid = (triton.cdiv(N, bn), triton.cdiv(M, bm), splits)
    ws, cnt = workspace(y, grid)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _fp8_gemm_kernel[grid](x, w8, s8, y, ws, cnt, M, N, K, per, N // groups, groups, x.stride(0), w8.stride(0),
                               s8.stride(0), y.stride(0), ws.stride(0) if splits > 1 else 0,
                               BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, QUANT=quant,
                               num_warps=TUNE.get("warps", 4), num_stages=TUNE.get("stages", 4), **launch_args(x))
    return y
