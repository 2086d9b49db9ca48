"""Routed MoE experts at decode (FP4 / NVFP4 banks), grouped by expert, on tensor cores, in Triton.

Why: the CuTe kernel gives every (row, expert) pair its own pass over that expert's weights, so a
batch-16 step (96 rows over ~31 of 32 experts) reads ~3x the distinct expert bytes and took 19.0 ms
against 1.5 ms at batch 1 on an H200. Here each selected expert's weight tile is read once per K step
for all rows routed to it and multiplied on tensor cores (rows padded to BLOCK_M = 16).

Two launches, both capture-safe (fixed grids sized from R and E only, no host read of idx, current
stream):
1. `_group_kernel`, grid cdiv(R, BLOCK_R) + 1. Row programs give each row r its position in the
   stable sort by expert, pos[r] = #{j: idx[j] < idx[r]} + #{j < r: idx[j] == idx[r]} (an R x R
   comparison count, chunked), and write rows[pos[r]] = r (a permutation: every entry written once).
   The last program counts rows per expert (E x R comparisons), numbers the present experts in
   expert order by a cumsum (slot p = p-th distinct expert) and writes each slot's expert, first
   sorted position and row count; slots p >= #distinct get count 0. P = min(R, E) slots always suffice.
2. `_experts_kernel`, grid (N tiles, P slots). A program loops over its slot's rows in chunks of
   BLOCK_M (zero iterations for an empty slot); per K step it loads the expert's packed tile
   [BLOCK_N, BLOCK_K/2] once, decodes it to bf16 in registers and runs tl.dot against the gathered x
   rows, split into even/odd columns (the low nibble is the even element). Every output row is written
   by one program (the slot of its expert) with a fixed summation order: deterministic, no atomics.

The decode is what bounds this kernel's issue rate (a 4 TB/s stream of FP4 is ~33 weights per cycle per
SM), so on the GPU it is inline PTX on four packed bytes at a time: 13 integer instructions and four
bf16x2 multiplies per 8 weights (the plain Triton decode took ~585 SASS instructions per K step of a
warp, this one 287; on the H200 the 96-row w13 call went 250 -> 149 us).

Exactness (everything below is exact, so the only rounding is fp32 accumulation):
- GPU: an e2m1 nibble s.ee.m at bf16 bits s.0000000ee.m000000 is e2m1 * 2^-126 (ee = 0: a bf16
  subnormal, the same identity). It is multiplied (bf16x2) by a factor = scale * 2^-C * 2^126 held in
  bf16, so the product is e2m1 * scale * 2^-C; C = 8 (FP4) or 16 (NVFP4) keeps the factor and every
  product a normal bf16, and the fp32 output is multiplied back by 2^C (a power of two: exact).
  FP4: factor 2^(b-1-C), exact for UE8M0 scale bytes 10 <= b <= 136 (scales 2^-117 .. 2^9; released
  FP4 weight scales sit far below 1). NVFP4: e4m3 * 2^110, products e2m1 * e4m3 * 2^-16 with <= 6
  significant bits in [2^-26, 2^12]: bf16-exact for every finite e4m3 scale.
- Interpreter (CPU): the nibble at fp16 bits s.00ee.m000000000 is e2m1 * 2^-14, converted to fp32 and
  multiplied by scale * 2^-C * 2^14: the same values.
- bf16 x bf16 products are exact in fp32. Each K step's two dots start from zero and the partial
  joins the running total with an ordinary fp32 add (tensor cores may truncate inside their own
  accumulation chain: see _triton_gemv.py).
Expert ids outside [0, E) are not checked (the twin would raise): such rows' outputs stay unwritten.
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from dsv4.kernels import overrides
from dsv4.kernels._pdl import launch_args, pdl_wait
from dsv4.kernels._triton_fp8 import _act_round

BLOCK_M = 16  # rows per tl.dot (its minimum); a slot with more rows loops over row chunks
BLOCK_R = 64  # rows per program of the grouping kernel
WARPS = 2  # per program of the expert GEMM
FORMATS = {"fp4": 32, "nvfp4": 16}  # elements per scale
QUANT_BLOCKS = 8  # 128-blocks of one x row rounded per program of the grouping launch (quant path)
TUNE = overrides.from_env("experts")  # overrides for a sweep: bn, bk, warps, stages (python -m dsv4.kernels.tune)


@triton.jit
def _group_kernel(idx_ptr, rows_ptr, slot_expert_ptr, slot_start_ptr, slot_count_ptr, R, P,
                  x_ptr, xr_ptr, K, sxm, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr, QB: tl.constexpr,
                  PDL: tl.constexpr):
    pdl_wait(PDL)
    pid = tl.program_id(0)
    jr = tl.arange(0, BLOCK_R)
    n_sort = tl.cdiv(R, BLOCK_R)
    if pid > n_sort:  # (quant path) one chunk of an x row, rounded to e4m3 times its block scale
        _round_rows(x_ptr, xr_ptr, pid - n_sort - 1, K, sxm, QB)
    elif pid < n_sort:  # sorted position of each of this program's rows
        r = pid * BLOCK_R + jr
        ir = tl.load(idx_ptr + r, mask=r < R, other=0).to(tl.int32)
        pos = tl.zeros((BLOCK_R,), dtype=tl.int32)
        for j0 in range(0, R, BLOCK_R):
            j = j0 + jr
            ij = tl.load(idx_ptr + j, mask=j < R, other=0).to(tl.int32)
            before = (ij[None, :] < ir[:, None]) | ((ij[None, :] == ir[:, None]) & (j[None, :] < r[:, None]))
            pos += tl.sum((before & (j[None, :] < R)).to(tl.int32), axis=1)
        tl.store(rows_ptr + pos, r, mask=r < R)
    else:  # the slots: present experts in expert order
        e = tl.arange(0, BLOCK_E)
        cnt = tl.zeros((BLOCK_E,), dtype=tl.int32)
        less = tl.zeros((BLOCK_E,), dtype=tl.int32)
        for j0 in range(0, R, BLOCK_R):
            j = j0 + jr
            ij = tl.load(idx_ptr + j, mask=j < R, other=0).to(tl.int32)
            ok = (j < R)[None, :]
            cnt += tl.sum(((ij[None, :] == e[:, None]) & ok).to(tl.int32), axis=1)
            less += tl.sum(((ij[None, :] < e[:, None]) & ok).to(tl.int32), axis=1)
        present = cnt > 0
        slot = tl.cumsum(present.to(tl.int32), axis=0) - 1
        tl.store(slot_expert_ptr + slot, e, mask=present)
        tl.store(slot_start_ptr + slot, less, mask=present)
        tl.store(slot_count_ptr + slot, cnt, mask=present)
        n_used = tl.sum(present.to(tl.int32), axis=0)
        tl.store(slot_count_ptr + e, tl.zeros((BLOCK_E,), dtype=tl.int32), mask=(e >= n_used) & (e < P))


@triton.jit
def _round_rows(x_ptr, xr_ptr, chunk, K, sxm, QB: tl.constexpr):
    """One QB x 128 chunk of one x row rounded as fp8_fake_quant(x, 128) does (the FP8 GEMM's prologue
    rounding) into xr [R, K] bf16: e4m3 values times a power of two are bf16 values, so this is exact."""
    per_row = tl.cdiv(K, 128 * QB)
    r = chunk // per_row
    b = (chunk % per_row) * QB + tl.arange(0, QB)  # this chunk's 128-blocks
    kk = b[None, :] * 128 + tl.arange(0, 128)[:, None]  # [128, QB]
    ok = kk < K
    xq, xs = _act_round(tl.load(x_ptr + r * sxm + kk, mask=ok, other=0.0))
    tl.store(xr_ptr + r * K + kk, (xq.to(tl.float32) * xs[None, :]).to(tl.bfloat16), mask=ok)


@triton.jit
def _e2m1_x(code, mult):
    """e2m1 codes (low 4 bits of an int32) times mult (fp32, already holding the 2^14) -> bf16, exactly.
    The interpreter's decode: same values as _nibbles_x, in plain integer and float ops."""
    h = (((code & 8) << 12) | ((code & 7) << 9)).to(tl.uint16).to(tl.float16, bitcast=True)
    return (h.to(tl.float32) * mult).to(tl.bfloat16)


# Four packed bytes ($2) -> bf16 pairs of one nibble of each ($0: bytes 0, 1; $1: bytes 2, 3), times the
# bf16 factor pairs $3, $4. With the nibble in bits 7:4 of its byte (the low nibble shifted up first),
# prmt writes [byte A, sign of A, byte B, sign of B] (selector bit 3 replicates a byte's top bit across a
# byte); one shift by 2 and one mask leave bf16 bits s.0000000ee.m000000 in each half: the value
# e2m1 * 2^-126 (ee = 0: a bf16 subnormal, the same identity).
_NIBBLE_ASM = """{{
.reg .b32 t, d;
{first}
prmt.b32 d, t, 0, 0x9180; shl.b32 d, d, 2; and.b32 d, d, 0x81C081C0; mul.rn.bf16x2 $0, d, $3;
prmt.b32 d, t, 0, 0xB3A2; shl.b32 d, d, 2; and.b32 d, d, 0x81C081C0; mul.rn.bf16x2 $1, d, $4;
}}"""
_LO_ASM = tl.constexpr(_NIBBLE_ASM.format(first="shl.b32 t, $2, 4;"))  # low nibbles: even elements
_HI_ASM = tl.constexpr(_NIBBLE_ASM.format(first="mov.b32 t, $2;"))  # high nibbles: odd elements


@triton.jit
def _nibbles_x(wb, factor, HIGH: tl.constexpr, ASM: tl.constexpr):
    """One nibble of each packed e2m1 byte times its scale, as bf16 (exact). ASM (on the GPU): 13 integer
    ops and four bf16x2 multiplies per 8 weights; factor is the bf16 scale * 2^112 (the decoded
    nibble is e2m1 * 2^-126). Otherwise factor is the fp32 scale * 2^14 and the interpreter's decode runs."""
    if ASM:
        f = tl.broadcast_to(factor.to(tl.bfloat16), wb.shape)
        return tl.inline_asm_elementwise(_HI_ASM if HIGH else _LO_ASM, "=r,=r,r,r,r", [wb, f],
                                         dtype=tl.bfloat16, is_pure=True, pack=4)
    code = wb.to(tl.int32) & 0xFF
    return _e2m1_x((code >> 4) if HIGH else code, factor)


@triton.jit
def _experts_kernel(x_ptr, w_ptr, s_ptr, g_ptr, y_ptr, rows_ptr, slot_expert_ptr, slot_start_ptr, slot_count_ptr,
                    N, K, sxm, swe, swn, sse, ssn, sym, NV: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr,
                    PDL: tl.constexpr):
    pdl_wait(PDL)
    SB: tl.constexpr = 16 if NV else 32  # elements per scale
    G: tl.constexpr = BLOCK_K // SB  # scale groups per K step
    slot = tl.program_id(1)
    count = tl.load(slot_count_ptr + slot)
    expert = tl.load(slot_expert_ptr + slot).to(tl.int64)
    start = tl.load(slot_start_ptr + slot)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rg = tl.arange(0, G)
    rb = tl.arange(0, SB // 2)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    w_tile = w_ptr + expert * swe + rn[:, None, None] * swn + rg[None, :, None] * (SB // 2) + rb[None, None, :]
    s_tile = s_ptr + expert * sse + rn[:, None] * ssn + rg[None, :]
    for m0 in range(0, count, BLOCK_M):  # no iteration for an empty slot
        m = m0 + tl.arange(0, BLOCK_M)
        m_ok = m < count
        rows = tl.load(rows_ptr + start + m, mask=m_ok, other=0).to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_ptr + rows[:, None] * sxm + k0 + rk[None, :], mask=m_ok[:, None], other=0.0)
            x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_M, BLOCK_K // 2, 2)))
            wb = tl.load(w_tile + k0 // 2, mask=n_ok[:, None, None], other=0)
            sb = tl.load(s_tile + k0 // SB, mask=n_ok[:, None], other=0).to(tl.int32) & 0xFF
            # mult: the true scale * 2^-C (C = 16 NVFP4, 8 FP4: every product stays a normal bf16; the
            # 2^C goes back on the fp32 output) * 2^14 (the interpreter's fp16 decode)
            if NV:  # e4m3 * 2^-2: fp16 bits s.0eeee.mmm0000000 are e4m3 * 2^-8
                h = (((sb & 0x80) << 8) | ((sb & 0x7F) << 7)).to(tl.uint16).to(tl.float16, bitcast=True)
                mult = h.to(tl.float32) * 64.0
            else:  # 2^(b - 127 - 8 + 14)
                mult = ((sb + 6) << 23).to(tl.float32, bitcast=True)
            if ASM:
                mult = mult * 5.192296858534828e33  # 2^112: the asm's nibble is e2m1 * 2^-126
            mult = mult[:, :, None]
            w_lo = tl.reshape(_nibbles_x(wb, mult, False, ASM), (BLOCK_N, BLOCK_K // 2))  # even elements
            w_hi = tl.reshape(_nibbles_x(wb, mult, True, ASM), (BLOCK_N, BLOCK_K // 2))  # odd elements
            part = tl.dot(x_odd, tl.trans(w_hi))
            part = tl.dot(x_even, tl.trans(w_lo), part)
            acc += part  # an fp32 add, not a tensor-core accumulation (see the module docstring)
        if NV:
            acc *= tl.load(g_ptr + expert) * 65536.0
        else:
            acc *= 256.0
        tl.store(y_ptr + rows[:, None] * sym + rn[None, :], acc, mask=m_ok[:, None] & n_ok[None, :])


def tiles(R: int, E: int, N: int, K: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, P). BLOCK_K 128 (a 64-byte packed row segment per step) where K allows,
    BLOCK_N 64 with WARPS = 2 warps: the best of a sweep on the H200 at 6, 24, 96 and 384 rows (more,
    smaller programs keep more weight loads in flight; BLOCK_K 256 or BLOCK_N 128 need more registers
    and lose occupancy). sm_90 build (ptxas): ~117 registers at 4 warps, no spills."""
    P = min(R, E)
    bk = 128 if K % 128 == 0 else 64 if K % 64 == 0 else 32
    bk = TUNE.get("bk", bk) if K % TUNE.get("bk", bk) == 0 else bk
    return TUNE.get("bn", 64), bk, P


def grouped_expert_gemm(fmt: str, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, idx: torch.Tensor,
                        global_scale: torch.Tensor | None = None, out: torch.Tensor | None = None,
                        quant: bool = False) -> torch.Tensor:
    """Row r of x [R, K] bf16 through expert idx[r] of weight [E, N, K/2] (packed e2m1) with scale
    [E, N, K/32] UE8M0 (fp4) or [E, N, K/16] e4m3 and global_scale [E] fp32 (nvfp4) -> fp32 [R, N].
    quant: x is first rounded as `fp8_fake_quant(x, 128)` does (the released activation rounding),
    by extra programs of the grouping launch: no rounding kernel in front of the GEMM."""
    if fmt not in FORMATS:
        raise ValueError(f"grouped_expert_gemm: format {fmt!r}, expected one of {sorted(FORMATS)}")
    nv = fmt == "nvfp4"
    R, K = x.shape
    E, N, Kh = weight.shape
    sb = FORMATS[fmt]
    if (Kh * 2 != K or K % 32 or x.dtype != torch.bfloat16 or scale.shape != (E, N, K // sb)
            or idx.shape != (R,) or (nv and (global_scale is None or global_scale.numel() != E))
            or (quant and K % 128)):
        raise ValueError(f"grouped_expert_gemm({fmt}{', quant' if quant else ''}): x {x.dtype} {tuple(x.shape)}, "
                         f"weight {tuple(weight.shape)}, scale {tuple(scale.shape)}, idx {tuple(idx.shape)}")
    y = out if out is not None else torch.empty(R, N, dtype=torch.float32, device=x.device)
    if R == 0:
        return y
    if x.stride(1) != 1:
        x = x.contiguous()
    w = weight.view(torch.uint8)
    s = scale.view(torch.uint8)
    if w.stride(2) != 1 or s.stride(2) != 1:
        w, s = w.contiguous(), s.contiguous()
    g = global_scale.reshape(E).float().contiguous() if nv else y  # not read for fp4
    bn, bk, P = tiles(R, E, N, K)
    work = torch.empty(R + 3 * P, dtype=torch.int32, device=x.device)
    rows, slot_expert, slot_start, slot_count = work[:R], work[R:R + P], work[R + P:R + 2 * P], work[R + 2 * P:]
    xr = torch.empty(R, K if quant else 0, dtype=torch.bfloat16, device=x.device)
    chunks = R * triton.cdiv(K, 128 * QUANT_BLOCKS) if quant else 0
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _group_kernel[(triton.cdiv(R, BLOCK_R) + 1 + chunks,)](
            idx, rows, slot_expert, slot_start, slot_count, R, P, x, xr, K, x.stride(0),
            BLOCK_R=BLOCK_R, BLOCK_E=triton.next_power_of_2(E), QB=QUANT_BLOCKS, **launch_args(x))
        if quant:  # the rounded rows, written by the grouping launch (ordered before the next launch)
            x = xr
        if x.is_cuda and _slots_mma(fmt, K, R, E):  # the tensor-core CuTe kernel on the same slots
            from dsv4.kernels import launch

            return launch.fp4_slots(x.contiguous(), weight, scale, rows, work[R:].view(3, P), y)
        _experts_kernel[(triton.cdiv(N, bn), P)](
            x, w, s, g, y, rows, slot_expert, slot_start, slot_count, N, K, x.stride(0), w.stride(0), w.stride(1),
            s.stride(0), s.stride(1), y.stride(0), NV=nv, BLOCK_M=BLOCK_M, BLOCK_N=bn, BLOCK_K=bk,
            ASM=x.is_cuda and not _interpreting(),
            num_warps=TUNE.get("warps", WARPS), num_stages=TUNE.get("stages", 4), **launch_args(x))
    return y


def _slots_mma(fmt: str, K: int, R: int, E: int) -> bool:
    from dsv4.kernels import launch

    return launch.slots_mma(fmt, K, R, E)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
