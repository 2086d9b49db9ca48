"""The mHC mix projection's reductions in one Triton launch per site.

`hc_mixes` is rms(flat(X)) @ fn^T: on an H200 a flash decode step ran it as an inductor reduction
(the sum of squares) plus a cuBLAS dot and its reduce kernel at batch 1 (3 launches, ~5 us per site,
87 sites), and at batch 16 as a SIMT sgemm plus a split-K reduce (1.1 ms per step). Here one kernel
reads the stream [T, hc*d] and fn [n_mix, hc*d] once and returns, per token, the n_mix dot products
and, in column n_mix, the sum of squares: [T, n_mix + 1] fp32. The caller scales the dots by
rsqrt(sumsq / (hc*d) + eps) (a pointwise op that inductor fuses into the Sinkhorn split), which is the
reference's rms-then-matmul up to fp32 rounding order.

CUDA cores, fp32 products and sums (fn is fp32 and the streams are bf16 or fp32: tensor cores would
need a three-term split of both operands for fp32 accuracy, at a few MFLOP per site not worth it).
K is split so the ~1.5 MB of fn streams through ~128 SMs; the splits are finished in the kernel by
the last program of each row block, which loads up to 32 partials per round trip
(_triton_splitk.store_small_tile), so the result is deterministic and a graph replay equals the eager
call. From 9 rows (a batch-16 step) one program holds every row and the products run as tl.dot in IEEE
fp32 (FMA, not tensor cores): the CUDA-core broadcast left ~8 K columns per step at 16 rows. Each
program loads its first fn tile before the PDL wait (fn is a parameter), so it streams while the
previous kernel finishes.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4.kernels._pdl import weight_args
from dsv4.kernels._triton_gemv import _first_w, _w_tile, _x_tile
from dsv4.kernels._triton_splitk import store_small_tile, workspace

PRODUCTS = 4096  # products held per program and K step (BLOCK_T * BLOCK_J * BLOCK_K), CUDA-core path
MAX_SPLITS = 128  # K splits per row block: ~12 KB of fn per program at batch 1, 128 programs
FINISH_CHUNK = 32  # partials the last program of a row block loads per round trip
DOT_MIN_T = 9  # rows from which a program holds 16+ rows and multiplies with tl.dot (fp32 FMA)
DOT_SPLITS = 32  # K splits on the dot path: the finish loads [16 x 32] partials, fewer round trips
FINISH_VALUES = 8192  # partial values per finishing round trip (CHUNK x tile)


@triton.jit
def _mix_step(acc, sq, x, f, DOT: tl.constexpr):
    """One K step: acc [BLOCK_T, BLOCK_J] += x f^T, sq [BLOCK_T] += sum(x^2), in fp32. The dot path runs the
    products as IEEE fp32 FMAs (no tensor-core rounding of either operand)."""
    x = x.to(tl.float32)
    if DOT:
        acc = tl.dot(x, tl.trans(f.to(tl.float32)), acc, input_precision="ieee")
    else:
        acc += tl.sum(x[:, None, :] * f.to(tl.float32)[None, :, :], axis=2)
    return acc, sq + tl.sum(x * x, axis=1)


@triton.jit
def _mix_sums_kernel(x_ptr, f_ptr, y_ptr, ws_ptr, cnt_ptr, T, J, K, K_PER_SPLIT, sxt, sfj, syt, sys,
                     BLOCK_T: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr,
                     DOT: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr):
    rt = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    rj = tl.arange(0, BLOCK_J)
    rk = tl.arange(0, BLOCK_K)
    k_begin = tl.program_id(2) * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    f = _first_w(f_ptr, rj, k_begin + rk, J, k_end, sfj, False, PDL, PREFETCH)
    acc = tl.zeros((BLOCK_T, BLOCK_J), dtype=tl.float32)
    sq = tl.zeros((BLOCK_T,), dtype=tl.float32)
    acc, sq = _mix_step(acc, sq, _x_tile(x_ptr, rt, k_begin + rk, T, k_end, sxt), f, DOT)
    for k0 in range(k_begin + BLOCK_K, k_end, BLOCK_K):
        kk = k0 + rk
        acc, sq = _mix_step(acc, sq, _x_tile(x_ptr, rt, kk, T, k_end, sxt), _w_tile(f_ptr, rj, kk, J, k_end, sfj), DOT)
    acc = tl.where(rj[None, :] == J, sq[:, None], acc)  # column J: the sum of squares
    store_small_tile(acc, y_ptr, ws_ptr, cnt_ptr, rt[:, None] * syt + rj[None, :], (rt[:, None] < T) & (rj[None, :] <= J),
                     tl.num_programs(2), sys, CHUNK)


def tiles(T: int, J: int, K: int) -> tuple[int, int, int, int]:
    """(BLOCK_T, BLOCK_J, BLOCK_K, splits).
    Up to 8 rows: up to 4 tokens per program, all n_mix + 1 columns, BLOCK_K from the products budget, K
    split into at most MAX_SPLITS parts (one K step each where K allows: the H200 showed 16 programs of 64
    steps latency-bound, 11.6 us per batch-1 site). From DOT_MIN_T rows: one program holds all rows (16-64,
    what tl.dot needs), BLOCK_K 64, DOT_SPLITS splits (the H200 measured the CUDA-core path at 16 rows,
    four row blocks of 128 splits, 19 us per site)."""
    bj = triton.next_power_of_2(J + 1)
    if T >= DOT_MIN_T:
        bt = min(max(triton.next_power_of_2(T), 16), 64)
        bk = min(64, max(16, triton.next_power_of_2(K)))
        return bt, max(bj, 16), bk, max(1, min(DOT_SPLITS, triton.cdiv(K, bk)))
    bt = min(triton.next_power_of_2(max(T, 1)), 4)
    bk = max(16, min(256, PRODUCTS // (bt * bj)))
    splits = max(1, min(MAX_SPLITS, triton.cdiv(K, bk)))
    return bt, bj, bk, splits


def mix_sums(x: torch.Tensor, fn: torch.Tensor) -> torch.Tensor:
    """x [T, K] (bf16 or fp32), fn [J, K] -> fp32 [T, J + 1]: x @ fn^T, and sum(x^2) in column J."""
    T, K = x.shape
    J = fn.shape[0]
    if fn.shape[1] != K or x.dtype not in (torch.bfloat16, torch.float32) or not fn.is_floating_point():
        raise ValueError(f"mix_sums: x {x.dtype} {tuple(x.shape)}, fn {fn.dtype} {tuple(fn.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if fn.stride(1) != 1:
        fn = fn.contiguous()
    y = torch.empty(T, J + 1, dtype=torch.float32, device=x.device)
    bt, bj, bk, splits = tiles(T, J, K)
    per = triton.cdiv(triton.cdiv(K, bk), splits) * bk
    grid = (1, triton.cdiv(T, bt), triton.cdiv(K, per))
    ws, cnt = workspace(y, grid)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _mix_sums_kernel[grid](x, fn, y, ws, cnt, T, J, K, per, x.stride(0), fn.stride(0), y.stride(0),
                               ws.stride(0) if grid[2] > 1 else 0, BLOCK_T=bt, BLOCK_J=bj, BLOCK_K=bk,
                               CHUNK=min(FINISH_CHUNK, max(1, FINISH_VALUES // (bt * bj))), DOT=bt >= 16,
                               num_warps=8 if bt >= 16 else 4, **weight_args(x))
    return y
