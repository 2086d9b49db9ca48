"""The CuTe DSL kernels: weight-only GEMV over FP4 / NVFP4 expert banks and FP8 dense weights.

Imports cutlass at module import, so only `launch.py` imports this, lazily, right before a GPU
kernel runs.

Shape of the work (decode: memory-bound, the weights are read once):
- One warp owns NW consecutive output rows n of one input row r. Its 32 lanes split K into
  chunks: a chunk is 16 bytes of weights (32 e2m1 or 16 e4m3), one 128-bit load per lane, so a
  warp reads 512 contiguous bytes per step (coalesced). A chunk of e2m1 is exactly one UE8M0
  block (1x32), of NVFP4 two e4m3-scale blocks (1x16), of FP8 one eighth of a 128x128 block.
- The x chunk is loaded once per step and reused for the warp's NW weight rows.
- Weights are decoded in registers (see _ptx.py), products are fp32 FMAs, each block's dot is
  scaled once, and a warp shuffle reduction finishes each output; lane 0 stores it.
- Grouped kernels (FP4, NVFP4): grid = (N / (WARPS*NW), rows); the expert of row r is read
  from device memory (`idx[r]`) inside the kernel: no host sync, capture-safe.
- FP8 dense: grid = (N / (WARPS*NW), ceil(M / MB)); the MB input rows of a CTA share each
  decoded weight chunk. With G groups (wo_a) output rows of group g read input row m*G + g.
A K tail (K/32 chunks not a multiple of 32) is handled by clamping the chunk index and zeroing
that chunk's scale; an N tail by clamping the row and skipping the store.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from dsv4.kernels._ptx import (absmax_f32, act_block_scale, bf16x2_to_f32, e2m1x8_to_f32, e4m3_round_bf16x2,
                               e4m3_round_x2, e4m3x2_to_f32, e4m3x4_to_f32, e8m0_to_f32_x64, ffma)

Constexpr = cutlass.Constexpr


def _imin(a, b):
    return cutlass.min(a, b)


def _load(tensor_row, width: int, cc):
    """`width` 32-bit words of chunk cc of a 1-D row view: one or two 128-bit loads."""
    tile = cute.zipped_divide(tensor_row, (width,))
    frag = cute.make_rmem_tensor((width,), Int32)
    cute.autovec_copy(tile[None, cc], frag)
    return frag


def _chunk(lane, j: int, KC: int):
    """Chunk index of lane at step j, clamped into range, and whether it is a real chunk."""
    c = lane + 32 * j
    if KC % 32 == 0:
        return c, Int32(1)
    return _imin(c, KC - 1), Int32(c < KC)


def _bf16_words(frag, n: int):
    xs = []
    for q in range(n):
        lo, hi = bf16x2_to_f32(frag[q])
        xs.append(lo)
        xs.append(hi)
    return xs


def _dot_e2m1_words(words, xs):
    """Two partial sums (ILP) over the words' 8 elements each -> fp32 dot (weights * 2^-6)."""
    s0 = Float32(0.0)
    s1 = Float32(0.0)
    for q in range(len(words)):
        v = e2m1x8_to_f32(words[q])
        for t in range(8):
            if t % 2 == 0:
                s0 = ffma(v[t], xs[8 * q + t], s0)
            else:
                s1 = ffma(v[t], xs[8 * q + t], s1)
    return s0 + s1


# Q, the activation rounding (fp8_fake_quant(x, 128), the released rule) done by the GEMV itself instead
# of two kernels in front: 0 = x arrives rounded (or is not rounded), 1 = each warp rounds its x chunks in
# registers at every step, 2 = the CTA rounds its x rows once into shared memory before the loop (every
# warp reads the same x: 1 repeats the rounding WARPS times; 2 pays one barrier instead).


def _act_round(xs, lanes: int, Q: int):
    """With Q == 1, the lane's x values rounded as fp8_fake_quant(x, 128); a 128 block spans `lanes`
    lanes of one step."""
    if Q != 1:
        return xs
    s, inv = act_block_scale(absmax_f32(xs), lanes)
    out = []
    for t in range(0, len(xs), 2):
        out.extend(e4m3_round_x2(xs[t], xs[t + 1], s, inv))
    return out


def _round_rows_to_smem(rows, words: int, KC: int, tidx, WARPS: int):
    """Q == 2: x rows `rows` ([K] bf16 views as int32 words) rounded into a shared [len(rows), K/2] tensor.
    A chunk is `words` words; thread t rounds chunks t, t + 32*WARPS, ...; a 128 block is 64 / words
    consecutive lanes, so its amax is their butterfly max. Every thread of the CTA must call this."""
    T = 32 * WARPS
    lanes = 64 // words
    sX = cutlass.memory.SmemAllocator().allocate_tensor(Int32, cute.make_layout((len(rows), KC * words)),
                                                        byte_alignment=16)
    for mm in range(len(rows)):
        srow = cute.zipped_divide(sX[mm, None], (words,))
        for i in range((KC + T - 1) // T):
            c = tidx + T * i
            if KC % T:  # past the end: a whole block again (KC % lanes == 0), which stores the same values
                c = c % KC
            frag = _load(rows[mm], words, c)
            s, inv = act_block_scale(absmax_f32(_bf16_words(frag, words)), lanes)
            out = cute.make_rmem_tensor((words,), Int32)
            for q in range(words):
                out[q] = e4m3_round_bf16x2(frag[q], s, inv)
            cute.autovec_copy(out, srow[None, c])
    cute.arch.sync_threads()
    return [sX[mm, None] for mm in range(len(rows))]


def _warp_sum(v):
    return cute.arch.warp_reduction_sum(v)


def _pdl_wait(PDL: bool):
    """Programmatic dependent launch (dsv4/kernels/_pdl.py): wait for the previous grid to complete and
    flush, then let the next grid launch. Everything before this call may only read weights."""
    if cutlass.const_expr(PDL):
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()


def _grouped_issue(mX, mS, xrow, wrows, e, nrows, lane, j: int, KC: int, Q: int):
    """Issue every load of step j (x chunk, NW weight chunks, NW scales) before any math; with Q == 2
    the x chunk is read from shared memory when it is used (it is not there yet)."""
    cc, valid = _chunk(lane, j, KC)
    xf = None if Q == 2 else _load(xrow, 16, cc)
    ws = [_load(w, 4, cc) for w in wrows]
    ss = [Int32(mS[e, n, cc]) for n in nrows]
    return cc, valid, xf, ws, ss


# ---------------------------------------------------------------- grouped e2m1 experts: FP4 and NVFP4
# One kernel for both formats (NV is a compile-time flag): FP4 = e2m1 + UE8M0 per 32 (one scale per
# chunk); NVFP4 = e2m1 + e4m3 per 16 (two per chunk) + an fp32 global scale per expert (mG, unread
# for FP4). PD = how many chunk steps of loads are in flight ahead of the math.


def _grouped_step(acc, ws, ss, xs, valid, NV: bool):
    """acc += one chunk of an expert row: (32 e2m1 . 32 x) times the chunk's block scale(s)."""
    if NV:
        vf = Float32(valid)
        s0, s1 = e4m3x2_to_f32(ss)
        acc = ffma(_dot_e2m1_words([ws[0], ws[1]], xs[0:16]), s0 * vf, acc)
        return ffma(_dot_e2m1_words([ws[2], ws[3]], xs[16:32]), s1 * vf, acc)
    return ffma(_dot_e2m1_words([ws[q] for q in range(4)], xs), e8m0_to_f32_x64(ss, valid), acc)


def _expert_scale(mG, e, NV: bool):
    """NVFP4: the expert's global scale times the 2^6 of the e2m1 decode (FP4 folds 2^6 into its
    block scales): None for FP4."""
    return Float32(mG[e]) * 64.0 if NV else None


def _scaled(tot, g):
    return tot if g is None else tot * g


def _blocks(bx, warp, RB: int, WARPS: int, NW: int, N: int):
    """The RB row blocks of a CTA, in order: (first row of the warp's NW rows, their clamped indices).
    One CTA streams its blocks' chunk steps through one pipeline (no refill between blocks)."""
    out = []
    for b in range(RB):
        nbase = ((bx * RB + b) * WARPS + warp) * NW
        out.append((nbase, [_imin(nbase + i, N - 1) for i in range(NW)]))
    return out


@cute.kernel
def fp4_grouped_kernel(mX: cute.Tensor, mW: cute.Tensor, mS: cute.Tensor, mG: cute.Tensor,
                   mIdx: cute.Tensor, mY: cute.Tensor, N: Constexpr, KC: Constexpr, NW: Constexpr,
                   WARPS: Constexpr, CPL: Constexpr, PD: Constexpr, NV: Constexpr, PDL: Constexpr,
                   ONE: Constexpr, Q: Constexpr, RB: Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bx, by, _ = cute.arch.block_idx()
    lane = tidx % 32
    warp = tidx // 32
    r = by
    _pdl_wait(PDL)  # the expert ids come from the previous kernel: nothing to read before them
    e = Int32(mIdx[r])
    blocks = _blocks(bx, warp, RB, WARPS, NW, N)
    wrows = [[mW[e, n, None] for n in nrows] for _, nrows in blocks]
    xrow = mX[0 if ONE else r, None]  # ONE: x is one row that every expert row reads (batch 1's token)
    jobs = [(b, j) for b in range(RB) for j in range(CPL)]
    acc = [Float32(0.0) for _ in range(NW)]
    stages = [_grouped_issue(mX, mS, xrow, wrows[jobs[t][0]], e, blocks[jobs[t][0]][1], lane, jobs[t][1], KC, Q)
              for t in range(min(PD, len(jobs)))]
    if cutlass.const_expr(Q == 2):  # the first weight loads are in flight meanwhile (issue reads no x)
        xrow = _round_rows_to_smem([xrow], 16, KC, tidx, WARPS)[0]
    g = _expert_scale(mG, e, NV)
    for t in cutlass.range_constexpr(len(jobs)):
        if cutlass.const_expr(t + PD < len(jobs)):
            b, j = jobs[t + PD]
            stages.append(_grouped_issue(mX, mS, xrow, wrows[b], e, blocks[b][1], lane, j, KC, Q))
        b, j = jobs[t]
        cc, valid, xf, ws, ss = stages[t]
        if cutlass.const_expr(Q == 2):
            xf = _load(xrow, 16, cc)
        xs = _act_round(_bf16_words(xf, 16), 4, Q)
        for i in cutlass.range_constexpr(NW):
            acc[i] = _grouped_step(acc[i], ws[i], ss[i], xs, valid, NV)
        if cutlass.const_expr(j == CPL - 1):  # the block's rows are done: store them, start the next
            nbase = blocks[b][0]
            for i in cutlass.range_constexpr(NW):
                tot = _scaled(_warp_sum(acc[i]), g)
                if lane == 0:
                    if nbase + i < N:
                        mY[r, nbase + i] = tot
            acc = [Float32(0.0) for _ in range(NW)]


@cute.jit  # both e2m1 formats (the name keeps profiles' "FP4 experts" family)
def fp4_grouped(mX: cute.Tensor, mW: cute.Tensor, mS: cute.Tensor, mG: cute.Tensor, mIdx: cute.Tensor,
            mY: cute.Tensor, stream: cuda.CUstream, N: Constexpr, KC: Constexpr, NW: Constexpr,
            WARPS: Constexpr, CPL: Constexpr, ROWS: Constexpr, PD: Constexpr, NV: Constexpr, PDL: Constexpr,
            ONE: Constexpr, Q: Constexpr, RB: Constexpr):
    grid_x = (N + WARPS * NW * RB - 1) // (WARPS * NW * RB)
    fp4_grouped_kernel(mX, mW, mS, mG, mIdx, mY, N, KC, NW, WARPS, CPL, PD, NV, PDL, ONE, Q, RB).launch(
        grid=(grid_x, ROWS, 1), block=(32 * WARPS, 1, 1), stream=stream, use_pdl=PDL)


# ---------------------------------------------------------------- FP8 e4m3 + UE8M0 128x128, dense


def _fp8_issue(mS, wrows, nrows, lane, j: int, KC: int):
    """Weight chunk (16 e4m3) and 128x128 scale of each of the warp's rows for step j."""
    cc, valid = _chunk(lane, j, KC)
    ws = [_load(w, 4, cc) for w in wrows]
    ss = [Int32(mS[n // 128, cc // 8]) for n in nrows]
    return cc, valid, ws, ss


def _fp8_xrow(mX, m, nbase, N: int, G: int):
    """Input row of token m for the warp's rows: x is [M, K] (G = 1) or [M * G, K] with output rows
    [g * N/G, (g+1) * N/G) reading row m * G + g (wo_a's groups in one launch; NW divides N/G)."""
    if G == 1:
        return mX[m, None]
    return mX[m * G + _imin(nbase, N - 1) // (N // G), None]


@cute.kernel
def fp8_kernel(mX: cute.Tensor, mW: cute.Tensor, mS: cute.Tensor, mY: cute.Tensor,
               M: Constexpr, N: Constexpr, KC: Constexpr, NW: Constexpr, WARPS: Constexpr,
               CPL: Constexpr, MB: Constexpr, PD: Constexpr, G: Constexpr, PDL: Constexpr, Q: Constexpr,
               RB: Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bx, by, _ = cute.arch.block_idx()
    lane = tidx % 32
    warp = tidx // 32
    m0 = by * MB
    blocks = _blocks(bx, warp, RB, WARPS, NW, N)
    wrows = [[mW[n, None] for n in nrows] for _, nrows in blocks]
    xrows = [[_fp8_xrow(mX, _imin(m0 + mm, M - 1), nbase, N, G) for mm in range(MB)] for nbase, _ in blocks]
    jobs = [(b, j) for b in range(RB) for j in range(CPL)]
    acc = [[Float32(0.0) for _ in range(NW)] for _ in range(MB)]
    stages = [_fp8_issue(mS, wrows[jobs[t][0]], blocks[jobs[t][0]][1], lane, jobs[t][1], KC)
              for t in range(min(PD, len(jobs)))]
    _pdl_wait(PDL)  # the first PD weight chunks are in flight while the previous kernel finishes
    if cutlass.const_expr(Q == 2):  # G == 1: every warp and block of the CTA reads the same MB rows
        shared = _round_rows_to_smem(xrows[0], 8, KC, tidx, WARPS)
        xrows = [shared for _ in range(RB)]
    for t in cutlass.range_constexpr(len(jobs)):
        if cutlass.const_expr(t + PD < len(jobs)):
            b, j = jobs[t + PD]
            stages.append(_fp8_issue(mS, wrows[b], blocks[b][1], lane, j, KC))
        b, j = jobs[t]
        cc, valid, ws, ss = stages[t]
        wv = []
        sc = []
        for i in cutlass.range_constexpr(NW):
            vals = []
            for q in cutlass.range_constexpr(4):
                vals.extend(e4m3x4_to_f32(ws[i][q]))
            wv.append(vals)
            sc.append(e8m0_to_f32_x64(ss[i], valid))
        for mm in cutlass.range_constexpr(MB):
            xs = _act_round(_bf16_words(_load(xrows[b][mm], 8, cc), 8), 8, Q)
            for i in cutlass.range_constexpr(NW):
                s0 = Float32(0.0)
                s1 = Float32(0.0)
                for u in cutlass.range_constexpr(16):
                    if cutlass.const_expr(u % 2 == 0):
                        s0 = ffma(wv[i][u], xs[u], s0)
                    else:
                        s1 = ffma(wv[i][u], xs[u], s1)
                acc[mm][i] = ffma(s0 + s1, sc[i], acc[mm][i])
        if cutlass.const_expr(j == CPL - 1):  # the block's rows are done: store them, start the next
            nbase = blocks[b][0]
            for mm in cutlass.range_constexpr(MB):
                for i in cutlass.range_constexpr(NW):
                    tot = _warp_sum(acc[mm][i])
                    if lane == 0:
                        if nbase + i < N:
                            if m0 + mm < M:
                                mY[m0 + mm, nbase + i] = tot * 0.015625
            acc = [[Float32(0.0) for _ in range(NW)] for _ in range(MB)]


@cute.jit
def fp8_dense(mX: cute.Tensor, mW: cute.Tensor, mS: cute.Tensor, mY: cute.Tensor,
              stream: cuda.CUstream, M: Constexpr, N: Constexpr, KC: Constexpr, NW: Constexpr,
              WARPS: Constexpr, CPL: Constexpr, MB: Constexpr, PD: Constexpr, G: Constexpr, PDL: Constexpr,
              Q: Constexpr, RB: Constexpr):
    grid_x = (N + WARPS * NW * RB - 1) // (WARPS * NW * RB)
    grid_y = (M + MB - 1) // MB
    fp8_kernel(mX, mW, mS, mY, M, N, KC, NW, WARPS, CPL, MB, PD, G, PDL, Q, RB).launch(
        grid=(grid_x, grid_y, 1), block=(32 * WARPS, 1, 1), stream=stream, use_pdl=PDL)


# ---------------------------------------------------------------- probe (tests only)


@cute.kernel
def probe_kernel(mW: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor,
                 mD: cute.Tensor):
    """Thread t runs each PTX decode helper on word t: lets a GPU test pin the element order."""
    t, _, _ = cute.arch.thread_idx()
    w = Int32(mW[t])
    a = e2m1x8_to_f32(w)
    b = e4m3x4_to_f32(w)
    c = bf16x2_to_f32(w)
    d = e4m3x2_to_f32(w)
    for k in cutlass.range_constexpr(8):
        mA[t, k] = a[k]
    for k in cutlass.range_constexpr(4):
        mB[t, k] = b[k]
    for k in cutlass.range_constexpr(2):
        mC[t, k] = c[k]
        mD[t, k] = d[k]


@cute.jit
def probe(mW: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mD: cute.Tensor,
          stream: cuda.CUstream, T: Constexpr):
    probe_kernel(mW, mA, mB, mC, mD).launch(grid=(1, 1, 1), block=(T, 1, 1), stream=stream)
