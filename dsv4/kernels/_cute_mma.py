"""The FP4 expert GEMV on tensor cores (CuTe DSL, `mma.sync`), for decode rows whose activation the kernel
rounds itself (quant=True). Imports cutlass: only `launch.py` imports it, lazily.

Why: at batch 1 the CUDA-core kernel (_cute_gemv.fp4_grouped_kernel) is bound by instruction issue, about
3.5 instructions per weight element; here a weight element costs its share of the decode (13 instructions
per 8, stopping at f16 pairs) and the tensor core does the products (see _ptx_mma.py).
Measured on the H200 it is exact to the twin and SLOWER (34% of copy bandwidth against 59% on Flash's
w1 | w3 bank): a lane loads one 4-byte word and one scale byte per row and block, eight times the load
instructions of the CUDA-core kernel. Opt-in (DSV4_CUTE_MMA=1) as the base of the next form: 16-byte loads
per lane, the block scale folded into bf16 weights so one MMA may mix blocks (dsv4/kernels/NOTES.md, 17).

Shape of the work: a CTA owns RB tiles of 16 output rows of one input row r (expert idx[r]); its WARPS warps
split K, warp w taking scale blocks [w * BPW, (w + 1) * BPW) of 32 elements. Per block a lane loads one word
(8 e2m1) of each of its two rows (g and g + 8, lane = 4 g + t: word t of the block), decodes it to four f16
pairs and runs two MMAs (16 rows x 16 elements each) against the block's activation fragment; the block's
16 row sums (every column of the 16x8 result is the same: each B column holds the same x) join fp32
accumulators in one FMA with the weight's UE8M0 scale times the activation's 128-block scale. The warps'
partial sums meet in shared memory and are added in warp order: deterministic.

The activation: before the loop the CTA rounds its x row as fp8_fake_quant(x, 128) does, keeping the e4m3
values (x / s, exact in f16) in shared memory in fragment order (per block and lane t: (8t, 8t+2),
(8t+4, 8t+6), (8t+1, 8t+3), (8t+5, 8t+7), matching the decode's pairs) and each 128-block's s apart.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from dsv4.kernels._cute_gemv import _bf16_words, _imin, _load, _pdl_wait
from dsv4.kernels._ptx import absmax_f32, act_block_scale, ffma
from dsv4.kernels._ptx_mma import e2m1x8_to_f16x2, e4m3_q_f16x2, e8m0_x64, mma_f16_16x8x16

Constexpr = cutlass.Constexpr
ROWS = 16  # output rows of one MMA tile


def _fragments_to_smem(smem, xrow, KB: int, tidx, WARPS: int):
    """x row (bf16, [K] as int32 words) -> (fragments [KB, 16] int32 in fragment order, scales [KB / 4] fp32)
    in shared memory. Thread t rounds blocks t, t + 32*WARPS, ...; a 128-block is four consecutive blocks,
    four consecutive lanes, so its amax is their butterfly max. Every thread of the CTA must call this."""
    Tn = 32 * WARPS
    sF = smem.allocate_tensor(Int32, cute.make_layout((KB, 16), stride=(16, 1)), byte_alignment=16)  # row-major
    sS = smem.allocate_tensor(Float32, cute.make_layout((KB // 4,)), byte_alignment=16)
    for i in range((KB + Tn - 1) // Tn):
        c = tidx + Tn * i
        if KB % Tn:  # past the end: a whole 128-block again (KB % 4 == 0), which stores the same values
            c = c % KB
        xs = _bf16_words(_load(xrow, 16, c), 16)  # the block's 32 values
        s, inv = act_block_scale(absmax_f32(xs), 4)
        out = cute.make_rmem_tensor((16,), Int32)
        for t in range(4):
            v = xs[8 * t: 8 * t + 8]
            out[4 * t + 0] = e4m3_q_f16x2(v[0], v[2], inv)
            out[4 * t + 1] = e4m3_q_f16x2(v[4], v[6], inv)
            out[4 * t + 2] = e4m3_q_f16x2(v[1], v[3], inv)
            out[4 * t + 3] = e4m3_q_f16x2(v[5], v[7], inv)
        cute.autovec_copy(out, cute.zipped_divide(sF[c, None], (16,))[None, 0])
        sS[c // 4] = s  # the block's four lanes store the same scale
    cute.arch.sync_threads()
    return sF, sS


def _issue(mW, mS, e, rows, b, t):
    """Weight word t of block b of the lane's two rows, and the rows' scale bytes of block b."""
    return ([Int32(mW[e, n, b * 4 + t]) for n in rows], [Int32(mS[e, n, b]) for n in rows])


@cute.kernel
def fp4_mma_kernel(mX: cute.Tensor, mW: cute.Tensor, mS: cute.Tensor, mIdx: cute.Tensor, mY: cute.Tensor,
                   N: Constexpr, KB: Constexpr, WARPS: Constexpr, RB: Constexpr, PD: Constexpr, PDL: Constexpr,
                   ONE: Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bx, by, _ = cute.arch.block_idx()
    lane = tidx % 32
    warp = tidx // 32
    g = lane // 4
    t = lane % 4
    r = by
    BPW = KB // WARPS
    _pdl_wait(PDL)  # the expert ids come from the previous kernel: nothing to read before them
    e = Int32(mIdx[r])
    tiles = [(bx * RB + i) * ROWS for i in range(RB)]
    rows = [[_imin(n0 + g, N - 1), _imin(n0 + g + 8, N - 1)] for n0 in tiles]
    jobs = [(i, warp * BPW + j, j) for i in range(RB) for j in range(BPW)]
    stages = [_issue(mW, mS, e, rows[jobs[q][0]], jobs[q][1], t) for q in range(min(PD, len(jobs)))]
    smem = cutlass.memory.SmemAllocator()
    sF, sS = _fragments_to_smem(smem, mX[0 if ONE else r, None], KB, tidx, WARPS)  # weight loads in flight
    sR = smem.allocate_tensor(Float32, cute.make_layout((RB, WARPS, ROWS)), byte_alignment=16)
    acc = [Float32(0.0), Float32(0.0)]
    for q in cutlass.range_constexpr(len(jobs)):
        if cutlass.const_expr(q + PD < len(jobs)):
            i2, b2, _ = jobs[q + PD]
            stages.append(_issue(mW, mS, e, rows[i2], b2, t))
        i, b, j = jobs[q]
        ws, ss = stages[q]
        xf = _load(sF[b, None], 4, t)  # the block's fragment words of lane t
        lo = e2m1x8_to_f16x2(ws[0])
        hi = e2m1x8_to_f16x2(ws[1])
        zero = Float32(0.0)
        d = mma_f16_16x8x16((lo[0], hi[0], lo[1], hi[1]), (xf[0], xf[1]), (zero, zero, zero, zero))
        d = mma_f16_16x8x16((lo[2], hi[2], lo[3], hi[3]), (xf[2], xf[3]), d)
        sx = sS[b // 4]
        acc[0] = ffma(d[0], e8m0_x64(ss[0]) * sx, acc[0])
        acc[1] = ffma(d[2], e8m0_x64(ss[1]) * sx, acc[1])
        if cutlass.const_expr(j == BPW - 1):  # the tile's K slice is done: its partial sums to shared memory
            if t == 0:
                sR[i, warp, g] = acc[0]
                sR[i, warp, g + 8] = acc[1]
            acc = [Float32(0.0), Float32(0.0)]
    cute.arch.sync_threads()
    for i in cutlass.range_constexpr(RB):
        if tidx < ROWS:
            tot = Float32(0.0)
            for w in cutlass.range_constexpr(WARPS):
                tot = tot + sR[i, w, tidx]
            if tiles[i] + tidx < N:
                mY[r, tiles[i] + tidx] = tot


@cute.jit
def fp4_mma(mX: cute.Tensor, mW: cute.Tensor, mS: cute.Tensor, mIdx: cute.Tensor, mY: cute.Tensor,
            stream: cuda.CUstream, N: Constexpr, KB: Constexpr, WARPS: Constexpr, RB: Constexpr, PD: Constexpr,
            PDL: Constexpr, ONE: Constexpr, R: Constexpr):
    grid_x = (N + ROWS * RB - 1) // (ROWS * RB)
    fp4_mma_kernel(mX, mW, mS, mIdx, mY, N, KB, WARPS, RB, PD, PDL, ONE).launch(
        grid=(grid_x, R, 1), block=(32 * WARPS, 1, 1), stream=stream, use_pdl=PDL)
