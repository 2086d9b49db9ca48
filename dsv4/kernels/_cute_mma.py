"""The FP4 expert GEMM on tensor cores (CuTe DSL, bf16 `mma.sync`), for decode: batch 1 (a row per expert
pass) and grouped batches (every row routed to an expert in one pass over its weights). Imports cutlass:
only `launch.py` imports it, lazily.

Why: the CUDA-core kernel (_cute_gemv.fp4_grouped_kernel) is bound by instruction issue at about 3.5
instructions per weight element (decode, conversions, an FMA per element and row); the Triton grouped GEMM
moves every decoded tile through shared memory to reach its MMA layout. Here a lane decodes straight into
the MMA's register fragment: ~2.6 PTX instructions per weight element all told (see _ptx_text.py), shared by up to 8 x
rows, and a lane's loads are 16 bytes wide (a whole 32-element scale block of one row).

Shape of the work: a warp owns a tile of 16 output rows; per step of 128 K it loads, for its rows g and g+8
(lane = 4 g + t), the 16 bytes of scale block t (bytes [64 s + 16 t, +16) of the row) and the blocks' scale
bytes, decodes them to bf16 with the scale folded in (exact), and runs 8 `m16n8k16` MMAs. The MMA's K is a
permutation of the step's 128 elements: MMA j takes elements 32 t + 4 j + (0, 1) and (2, 3) from lane t
(its fragment's k = 2t, 2t+1 and 2t+8, 2t+9), the same for A (weights) and B (x), so the sum is the dot.
B's 8 columns are x rows: batch 1 puts the one row in every column, a grouped slot up to 8 of its rows
(more loop over chunks of 8). Each step's 8 MMAs start from zero and join an fp32 accumulator in an ordinary
add (tensor cores may truncate inside their own accumulation chain): deterministic, no atomics.

Modes (compile-time): SLOTS=False: CTA row by = input row r, expert idx[r] (x row 0 for every r when ONE),
the activation rounded by the CTA into shared memory when Q = 2 (fp8_fake_quant(x, 128)); SLOTS=True: CTA
row by = slot p of the Triton grouping launch (_triton_experts._group_kernel: expert, first sorted position,
row count, the sorted row ids), x already rounded there when the caller asked.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from dsv4.kernels._cute_gemv import _imin, _load, _pdl_wait, _round_rows_to_smem
from dsv4.kernels._ptx_mma import e2m1x8_bf16x2, e8m0_bf16x2, mma_bf16_16x8x16
from dsv4.kernels._ptx_text import FOLD

Constexpr = cutlass.Constexpr
ROWS = 16  # output rows of one MMA tile (a warp's)
COLS = 8  # x rows of one MMA (its N)


def _issue(mW, mS, e, rows, s: int, t):
    """The lane's 16 bytes (scale block 4 s + t) of each of its two rows, and the two blocks' scale bytes."""
    c = 4 * s + t
    return [_load(mW[e, n, None], 4, c) for n in rows], [Int32(mS[e, n, c]) for n in rows]


def _step(ws, ss, xf, acc):
    """acc (the lane's 4 fp32 sums of the 16 x 8 tile) += one 128-K step: 8 MMAs from zero, then one add."""
    f = [e8m0_bf16x2(b) for b in ss]
    dec = [[e2m1x8_bf16x2(w[m], fr) for m in range(4)] for w, fr in zip(ws, f)]  # [row][word] -> 4 pairs
    zero = Float32(0.0)
    d = (zero, zero, zero, zero)
    for j in range(8):
        m, p = j // 2, 2 * (j % 2)
        a = (dec[0][m][p], dec[1][m][p], dec[0][m][p + 1], dec[1][m][p + 1])
        d = mma_bf16_16x8x16(a, (xf[2 * j], xf[2 * j + 1]), d)
    return [acc[i] + d[i] for i in range(4)]


@cute.kernel
def fp4_mma_kernel(mX: cute.Tensor, mW: cute.Tensor, mS: cute.Tensor, mIdx: cute.Tensor, mRows: cute.Tensor,
                   mSlot: cute.Tensor, mY: cute.Tensor, N: Constexpr, KB: Constexpr, WARPS: Constexpr,
                   PD: Constexpr, PDL: Constexpr, ONE: Constexpr, Q: Constexpr, SLOTS: Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bx, by, _ = cute.arch.block_idx()
    lane = tidx % 32
    g = lane // 4
    t = lane % 4
    n0 = (bx * WARPS + tidx // 32) * ROWS
    rows = [_imin(n0 + g, N - 1), _imin(n0 + g + 8, N - 1)]
    steps = KB // 4
    _pdl_wait(PDL)  # the expert ids come from the previous kernel: nothing to read before them
    e = Int32(0)
    start = Int32(0)
    count = Int32(1)
    if cutlass.const_expr(SLOTS):
        e = Int32(mSlot[0, by])
        start = Int32(mSlot[1, by])
        count = Int32(mSlot[2, by])
    else:
        e = Int32(mIdx[by])
    first = []  # batch 1: the first weight loads in flight before the x row is rounded (one pass: count 1)
    if cutlass.const_expr(not SLOTS):
        first = [_issue(mW, mS, e, rows, s, t) for s in range(min(PD, steps))]
    xrow = mX[0 if ONE else by, None]
    if cutlass.const_expr(Q == 2):  # every thread takes part; the x row in shared memory, rounded
        xrow = _round_rows_to_smem([xrow], 16, KB, tidx, WARPS)[0]
    for c0 in cutlass.range(0, count, COLS):  # zero iterations for an empty slot
        xr = xrow
        stages = list(first)
        if cutlass.const_expr(SLOTS):
            xr = mX[Int32(mRows[start + _imin(c0 + g, count - 1)]), None]  # column g: a row of the slot
            stages = [_issue(mW, mS, e, rows, s, t) for s in range(min(PD, steps))]
        acc = [Float32(0.0) for _ in range(4)]
        for s in cutlass.range_constexpr(steps):
            if cutlass.const_expr(s + PD < steps):
                stages.append(_issue(mW, mS, e, rows, s + PD, t))
            ws, ss = stages[s]
            acc = _step(ws, ss, _load(xr, 16, 4 * s + t), acc)
        for i in cutlass.range_constexpr(2):  # lane (g, t) holds columns 2t, 2t+1 of rows g, g+8
            c = c0 + 2 * t + i
            if c < count:
                r = by
                if cutlass.const_expr(SLOTS):
                    r = Int32(mRows[start + c])
                if n0 + g < N:
                    mY[r, n0 + g] = acc[i] * FOLD
                if n0 + g + 8 < N:
                    mY[r, n0 + g + 8] = acc[2 + i] * FOLD


@cute.jit
def fp4_mma(mX: cute.Tensor, mW: cute.Tensor, mS: cute.Tensor, mIdx: cute.Tensor, mRows: cute.Tensor,
            mSlot: cute.Tensor, mY: cute.Tensor, stream: cuda.CUstream, N: Constexpr, KB: Constexpr,
            WARPS: Constexpr, PD: Constexpr, PDL: Constexpr, ONE: Constexpr, Q: Constexpr, SLOTS: Constexpr,
            R: Constexpr):
    """R: CTA rows of the grid (input rows, or slots)."""
    grid_x = (N + ROWS * WARPS - 1) // (ROWS * WARPS)
    fp4_mma_kernel(mX, mW, mS, mIdx, mRows, mSlot, mY, N, KB, WARPS, PD, PDL, ONE, Q, SLOTS).launch(
        grid=(grid_x, R, 1), block=(32 * WARPS, 1, 1), stream=stream, use_pdl=PDL)
