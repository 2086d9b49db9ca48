"""bf16-weight GEMV with fp32 activations and fp32 accumulation, in Triton.

The released model runs its bf16 weights in fp32: the LM head (129280 x 4096, a gigabyte read
every token), the compressors' wkv/wgate, the indexer's weights_proj, the MoE gate. The twin
(`x.float() @ w.float().t()`) materializes an fp32 copy of the weight every step, writing twice
the bytes it reads; this kernel reads each bf16 weight once and widens it in registers.

Two paths, one result (both match float64 to fp32 accumulation error):
- M < TC_MIN_M (batch 1-2): CUDA cores, x[:, None, :] * w[None, :, :] added into per-lane partial
  sums, reduced across K once at the end (a reduction per step cost cross-lane shuffles for every
  tile). The products held per step are capped (ELEMS), so BLOCK_N shrinks as M grows: at M = 16 it
  is 4 and ~32,000 programs each re-read the whole x tile (H200: a batch-16 step's bf16 GEMVs took 16.5 ms
  against 1.97 ms at batch 1, for the same weight bytes).
- M >= TC_MIN_M: tensor cores. x is split in registers into three bf16 terms x = x0 + x1 + x2
  (x0 = bf16(x), x1 = bf16(x - x0), x2 = bf16(x - x0 - x1): 3 x 8 bits carry fp32's 24-bit
  mantissa, exactly for normal numbers), and tl.dot(x_i, w^T) accumulates the three in fp32; bf16 x
  bf16 products are exact in fp32, so this is fp32 math. Tensor cores may truncate when they add into
  their accumulator (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021), which over one
  chain of 3 x K/16 accumulations biases the sum (~2e-5 of max |y| at K = 4096 in a simulation); so
  each BLOCK_K step's three dots start from zero and their sum joins the running total with an
  ordinary fp32 add (~4e-7). (Triton folds `acc + dot(a, b)` into the dot only when the dot's own
  accumulator is zero, which the last of the three is not.) The rows are padded to BLOCK_M >= 16 (what
  tl.dot needs) and all rows of a decode batch (up to 64) share one program, so each weight tile is
  read from HBM once. The threshold is 3: at M = 3-4 the CUDA-core tile is already down to
  BLOCK_N = 16 (a quarter of the batch-1 tile) while the MMA path's padding (16 rows for 3) costs
  only tensor-core issue slots, far from the bound at these sizes; M = 1-2 keep the measured path.
  At M = 64 the three passes make ~190 flops per weight byte, near an H200's bf16 peak over its HBM
  bandwidth (~200), so the largest batches may be tensor-core bound rather than memory bound.

Under programmatic dependent launch (_pdl.py) each program loads its first weight tile before it waits for
the previous kernel: the weight is a parameter no kernel of the step writes, so those bytes stream while
the previous kernel finishes; the activation is read after the wait.

Deterministic: when N is too small to give the GPU enough programs (compressors, gate, weights_proj:
a few hundred rows of K = 4096; the H200 profile showed ~31 us per such launch, latency-bound with a
few KB in flight per SM), K is split, and the last split program of each tile sums the partials in
split order inside the kernel (_triton_splitk.py: no reduction launch), so a graph replay is bitwise
equal to the eager call. Imported lazily (Triton
is not needed on CPU machines); run under TRITON_INTERPRET=1 the tests check it on the CPU.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4.kernels._pdl import pdl_wait, weight_args
from dsv4.kernels._triton_splitk import store_tile, workspace

ELEMS = 8192  # CUDA-core path: products held in registers per program and K step (BLOCK_M * BLOCK_N * BLOCK_K)
TARGET_PROGRAMS = 264  # ~2 per SM of an H100/H200: enough bytes in flight to stream the weight
TC_MIN_M = 3  # rows from which the tensor-core path runs (see the module docstring)
# ... and output widths from which it runs at any row count: on an H200 a 16384 x 4096 weight streamed
# at 1.39 TB/s on the CUDA-core path at M = 1 and 2.30 TB/s on the tensor-core path at M = 16 (same
# bytes; padding rows costs only MMA issue). The LM head (129280 rows) is the case that matters.
TC_WIDE_N = 8192
TC_MAX_BLOCK_M = 64  # rows per tensor-core program (the decode batch cap); more rows take a grid dim


@triton.jit
def _tile(K, K_PER_SPLIT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """This program's rows, columns, K offsets and K range (grid: N tiles, M tiles, K splits)."""
    pid_s = tl.program_id(2)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k_begin = pid_s * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    return rm, rn, rk, k_begin, k_end, pid_s


@triton.jit
def _w_tile(w_ptr, rn, kk, N, k_end, swn):
    """The weight tile [BLOCK_N, BLOCK_K] at rows rn, columns kk (zeros past N and k_end)."""
    return tl.load(w_ptr + rn[:, None] * swn + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < k_end), other=0.0)


@triton.jit
def _wt_tile(w_ptr, rn, kk, N, k_end, swn):
    """The w^T tile [BLOCK_K, BLOCK_N]. With a row stride Triton specializes as a multiple of 16 (K = 4096)
    the pipeliner streams it through num_stages 16-byte cp.async buffers (seen in the sm_90 TTGIR)."""
    return tl.load(w_ptr + rn[None, :] * swn + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < k_end), other=0.0)


@triton.jit
def _x_tile(x_ptr, rm, kk, M, k_end, sxm):
    """The activation rows [BLOCK_M, BLOCK_K] at rows rm, columns kk (zeros past M and k_end)."""
    return tl.load(x_ptr + rm[:, None] * sxm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < k_end), other=0.0)


@triton.jit
def _first_w(w_ptr, rn, kk, N, k_end, swn, TRANS: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr):
    """The program's first weight tile (w^T where TRANS) and the PDL wait: the tile ahead of the wait where
    PREFETCH (a parameter no kernel of the step writes: it streams while the previous kernel ends)."""
    if PREFETCH:
        w = _wt_tile(w_ptr, rn, kk, N, k_end, swn) if TRANS else _w_tile(w_ptr, rn, kk, N, k_end, swn)
        pdl_wait(PDL)
    else:
        pdl_wait(PDL)
        w = _wt_tile(w_ptr, rn, kk, N, k_end, swn) if TRANS else _w_tile(w_ptr, rn, kk, N, k_end, swn)
    return w


@triton.jit
def _bf16_gemv_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, K_PER_SPLIT, sxm, swn, sym, sys,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
                      PREFETCH: tl.constexpr):
    rm, rn, rk, k_begin, k_end, pid_s = _tile(K, K_PER_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K)
    w = _first_w(w_ptr, rn, k_begin + rk, N, k_end, swn, False, PDL, PREFETCH)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)  # per-lane partial sums: no shuffles per step
    acc += _x_tile(x_ptr, rm, k_begin + rk, M, k_end, sxm)[:, None, :] * w.to(tl.float32)[None, :, :]
    for k0 in range(k_begin + BLOCK_K, k_end, BLOCK_K):
        kk = k0 + rk
        x = _x_tile(x_ptr, rm, kk, M, k_end, sxm)
        acc += x[:, None, :] * _w_tile(w_ptr, rn, kk, N, k_end, swn).to(tl.float32)[None, :, :]
    store_tile(tl.sum(acc, axis=2), y_ptr, ws_ptr, cnt_ptr, rm[:, None] * sym + rn[None, :],
               (rm[:, None] < M) & (rn[None, :] < N), tl.num_programs(2), sys)


@triton.jit
def _three_term_dot(x, wt):
    """x [BLOCK_M, BLOCK_K] fp32 times the bf16 w^T tile [BLOCK_K, BLOCK_N] in fp32 arithmetic on tensor
    cores: x split into three bf16 terms (see the module docstring), their dots from a zero partial."""
    x0 = x.to(tl.bfloat16)
    r = x - x0.to(tl.float32)  # exact in fp32
    x1 = r.to(tl.bfloat16)
    x2 = (r - x1.to(tl.float32)).to(tl.bfloat16)  # what is left fits in bf16
    part = tl.dot(x2, wt)  # this step's partial, smallest terms first
    part = tl.dot(x1, wt, part)
    return tl.dot(x0, wt, part)


@triton.jit
def _bf16_gemv_tc_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, K_PER_SPLIT, sxm, swn, sym, sys,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
                         PREFETCH: tl.constexpr):
    rm, rn, rk, k_begin, k_end, pid_s = _tile(K, K_PER_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K)
    wt = _first_w(w_ptr, rn, k_begin + rk, N, k_end, swn, True, PDL, PREFETCH)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc += _three_term_dot(_x_tile(x_ptr, rm, k_begin + rk, M, k_end, sxm), wt)
    for k0 in range(k_begin + BLOCK_K, k_end, BLOCK_K):
        kk = k0 + rk
        x = _x_tile(x_ptr, rm, kk, M, k_end, sxm)
        acc += _three_term_dot(x, _wt_tile(w_ptr, rn, kk, N, k_end, swn))  # an fp32 add: see the docstring
    store_tile(acc, y_ptr, ws_ptr, cnt_ptr, rm[:, None] * sym + rn[None, :], (rm[:, None] < M) & (rn[None, :] < N),
               tl.num_programs(2), sys)


def tiles(M: int, N: int, K: int) -> tuple[int, int, int, int, bool]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, splits, tensor_cores). K is split until the grid has ~TARGET_PROGRAMS
    programs (each split keeps at least two BLOCK_K steps).

    CUDA cores (M < TC_MIN_M and N < TC_WIDE_N): all rows in one program, BLOCK_N as wide as ELEMS allows, BLOCK_K 128.
    Tensor cores: BLOCK_M the batch padded to a power of two in [16, 64] (one weight read for all
    rows), BLOCK_K 64 (an 8-16 KB weight tile per pipeline stage), BLOCK_N 128 where that still gives
    TARGET_PROGRAMS programs (the LM head), else 64; the split count rounds down, so a grid near the
    target (N = 16384: 256 programs) is not split."""
    if M < TC_MIN_M and N < TC_WIDE_N:
        bm = min(triton.next_power_of_2(max(M, 1)), 16)
        bk = 128 if K >= 128 else triton.next_power_of_2(K)
        bn = min(max(ELEMS // (bm * bk), 1), triton.next_power_of_2(N))
        programs = triton.cdiv(N, bn) * triton.cdiv(M, bm)
        splits = max(1, min(triton.cdiv(TARGET_PROGRAMS, programs), triton.cdiv(K, bk) // 2))
        return bm, bn, bk, splits, False
    bm = min(max(triton.next_power_of_2(M), 16), TC_MAX_BLOCK_M)
    bk = min(64, max(triton.next_power_of_2(K), 16))
    m_tiles = triton.cdiv(M, bm)
    bn = 128 if triton.cdiv(N, 128) * m_tiles >= TARGET_PROGRAMS else min(64, max(triton.next_power_of_2(N), 16))
    programs = triton.cdiv(N, bn) * m_tiles
    splits = max(1, min(TARGET_PROGRAMS // programs, triton.cdiv(K, bk) // 2))
    return bm, bn, bk, splits, True


def bf16_gemv(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] fp32, w [N, K] bf16 (rows contiguous) -> fp32 [M, N] on the current stream. w must not be
    written by the kernel launched just before (a parameter): its first tile is read before the PDL wait."""
    M, K = x.shape
    N = w.shape[0]
    if w.shape[1] != K or x.dtype != torch.float32 or w.dtype != torch.bfloat16:
        raise ValueError(f"bf16_gemv: x {x.dtype} {tuple(x.shape)}, w {w.dtype} {tuple(w.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if w.stride(1) != 1:
        w = w.contiguous()
    y = out if out is not None else torch.empty(M, N, dtype=torch.float32, device=x.device)
    if y.shape != (M, N) or y.dtype != torch.float32:
        raise ValueError(f"bf16_gemv: out {y.dtype} {tuple(y.shape)}, want fp32 [{M}, {N}]")
    bm, bn, bk, splits, tc = tiles(M, N, K)
    per = triton.cdiv(triton.cdiv(K, bk), splits) * bk  # K per split, whole BLOCK_K steps
    splits = triton.cdiv(K, per)
    grid = (triton.cdiv(N, bn), triton.cdiv(M, bm), splits)
    ws, cnt = workspace(y, grid)
    if tc:  # Hopper: 3-4 weight tiles in flight per program; 8 warps for the 64 x 128 accumulator
        kernel, launch = _bf16_gemv_tc_kernel, dict(num_warps=8 if bm * bn >= 8192 else 4, num_stages=4)
    else:
        kernel, launch = _bf16_gemv_kernel, dict(num_warps=4)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        kernel[grid](x, w, y, ws, cnt, M, N, K, per, x.stride(0), w.stride(0), y.stride(0),
                     ws.stride(0) if splits > 1 else 0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, **launch, **weight_args(x))
    return y
