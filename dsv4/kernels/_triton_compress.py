"""A compressor's decode step as one Triton kernel: slot writes, gated pooling and the block shift.

dsv4/ops/compress.py is the twin and the reference. Under inductor the step is ~5 launches per
compressor (two slot writes, the pooling, and for ratio 4 two copy-backs of the block shift), two
compressors per ratio-4 layer. Here one program owns one batch row and a tile of pooled channels: it
loads the block's rows for its channels (for ratio 4 both halves, `a` = the previous block's rows
through channels [0, hd), `b` = this block's through [hd, 2hd)), puts the new token's values in its
slot in registers, pools (softmax over the rows, per channel, times kv), stores the new row, and,
when the token completes an overlapping block, copies this block's rows over the previous one.
Programs own disjoint channels and load everything before they store, so the result is the twin's
up to the order of the fp32 sums over the rows. Off unless DSV4_TRITON_COMPRESS=1 (not measured on
a GPU yet: dsv4/kernels/NOTES.md, session 9).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4.kernels._pdl import launch_args, pdl_wait

ELEMS = 4096  # block-state elements per program (rows x channels) of each of kv and z


@triton.jit
def _rows(ptr, b, rows, cols, mask, ssb, sss, slot, new_ptr, snb):
    """State values [rows, cols] of batch row b with the slot row replaced by the new token's (0 where
    masked: channels past hd, never stored)."""
    old = tl.load(ptr + b * ssb + rows[:, None] * sss + cols, mask=mask, other=0.0)
    new = tl.load(new_ptr + b * snb + cols, mask=mask, other=0.0)
    return tl.where(rows[:, None] == slot, new, old)


@triton.jit
def _store_new(kvn_ptr, zn_ptr, kvs_ptr, zs_ptr, b, c, mask, slot, skn, szn, ssb, sss):
    """The new token's kv and gate logits at channels c into its slot row."""
    tl.store(kvs_ptr + b * ssb + slot * sss + c, tl.load(kvn_ptr + b * skn + c, mask=mask), mask=mask)
    tl.store(zs_ptr + b * ssb + slot * sss + c, tl.load(zn_ptr + b * szn + c, mask=mask), mask=mask)


@triton.jit
def _compress_step_kernel(kvn_ptr, zn_ptr, kvs_ptr, zs_ptr, pos_ptr, out_ptr, HD, skn, szn, ssb, sss, sob,
                          M: tl.constexpr, R: tl.constexpr, OVERLAP: tl.constexpr, BLOCK_C: tl.constexpr,
                          PDL: tl.constexpr):
    pdl_wait(PDL)
    b = tl.program_id(0)
    j = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # pooled channels
    jm = (j < HD)[None, :]
    pos = tl.load(pos_ptr)
    r = tl.arange(0, R)  # the block's rows: 2M overlapping (previous block, this block), else M
    slot = pos % M
    col = j[None, :] + r[:, None] * 0  # row r's channel for pooled channel j
    if OVERLAP:
        slot += M
        col += tl.where(r[:, None] >= M, HD, 0)
    mask = jm & (r[:, None] < R)
    kv = _rows(kvs_ptr, b, r, col, mask, ssb, sss, slot, kvn_ptr, skn)
    z = _rows(zs_ptr, b, r, col, mask, ssb, sss, slot, zn_ptr, szn)
    e = tl.exp(z - tl.max(z, axis=0)[None, :])
    pooled = tl.sum(e / tl.sum(e, axis=0)[None, :] * kv, axis=0)
    if OVERLAP:  # this block's rows in both halves, before anything is stored
        rb = M + tl.arange(0, M)
        mb = jm & (rb[:, None] < R)
        kv_a = _rows(kvs_ptr, b, rb, j[None, :], mb, ssb, sss, slot, kvn_ptr, skn)
        z_a = _rows(zs_ptr, b, rb, j[None, :], mb, ssb, sss, slot, zn_ptr, szn)
        kv_b = _rows(kvs_ptr, b, rb, j[None, :] + HD, mb, ssb, sss, slot, kvn_ptr, skn)
        z_b = _rows(zs_ptr, b, rb, j[None, :] + HD, mb, ssb, sss, slot, zn_ptr, szn)
    tl.store(out_ptr + b * sob + j, pooled, mask=j < HD)
    _store_new(kvn_ptr, zn_ptr, kvs_ptr, zs_ptr, b, j, j < HD, slot, skn, szn, ssb, sss)  # the new token's row
    if OVERLAP:
        _store_new(kvn_ptr, zn_ptr, kvs_ptr, zs_ptr, b, j + HD, j < HD, slot, skn, szn, ssb, sss)
        if (pos + 1) % M == 0:  # the completed block becomes the previous one
            ra = rb[:, None] - M
            tl.store(kvs_ptr + b * ssb + ra * sss + j[None, :], kv_a, mask=mb)
            tl.store(zs_ptr + b * ssb + ra * sss + j[None, :], z_a, mask=mb)
            tl.store(kvs_ptr + b * ssb + ra * sss + j[None, :] + HD, kv_b, mask=mb)
            tl.store(zs_ptr + b * ssb + ra * sss + j[None, :] + HD, z_b, mask=mb)


def applies(kv_state: torch.Tensor, ratio: int, overlap: bool) -> bool:
    """The kernel's shapes: fp32 state [B, rows, c*hd] with rows a power of two (ratio 4 and 128)."""
    rows = 2 * ratio if overlap else ratio
    return (kv_state.dim() == 3 and kv_state.dtype == torch.float32 and kv_state.shape[1] == rows
            and rows & (rows - 1) == 0 and kv_state.stride(2) == 1 and (not overlap or kv_state.shape[2] % 2 == 0))


def compress_step(kv_new: torch.Tensor, z_new: torch.Tensor, kv_state: torch.Tensor, score_state: torch.Tensor,
                  pos: torch.Tensor, ratio: int, overlap: bool) -> torch.Tensor:
    """dsv4/ops/compress.compress_step_ref in one launch on the current stream (state written in place)."""
    B, rows, C = kv_state.shape
    if not applies(kv_state, ratio, overlap) or score_state.shape != kv_state.shape or \
            score_state.stride() != kv_state.stride() or kv_new.shape != (B, C) or z_new.shape != (B, C):
        raise ValueError(f"compress_step: state {tuple(kv_state.shape)} {kv_state.dtype}, new {tuple(kv_new.shape)}")
    kv_new, z_new = (t if t.stride(-1) == 1 else t.contiguous() for t in (kv_new.float(), z_new.float()))
    hd = C // 2 if overlap else C
    out = torch.empty(B, hd, dtype=torch.float32, device=kv_state.device)
    block_c = min(triton.next_power_of_2(hd), max(16, ELEMS // rows))
    grid = (B, triton.cdiv(hd, block_c))
    with torch.cuda.device(kv_state.device) if kv_state.is_cuda else contextlib.nullcontext():
        _compress_step_kernel[grid](kv_new, z_new, kv_state, score_state, pos, out, hd, kv_new.stride(0),
                                    z_new.stride(0), kv_state.stride(0), kv_state.stride(1), out.stride(0),
                                    M=ratio, R=rows, OVERLAP=overlap, BLOCK_C=block_c, num_warps=4, **launch_args(kv_state))
    return out
