"""A compressor's whole decode step in one Triton launch: the token's slot, and at a block's end the
gated pooling, the block shift, the entry's finish and its cache write.

The graph-ready step (dsv4/decode/static_attention.compressor_step) otherwise runs the state write,
the pooling and the shift as inductor kernels (one state buffer: dsv4/ops/compress.compress_step_both)
and the finish as the entry kernel (_triton_entry.py): ~4 launches per compressor and step, and it
pools every step although the entry is written only when the token completes its block (1 step in 4,
or 1 in 128). Here one program per batch row:

1. stores the token's kv and gate logits (plus the ape row of its place in the block, when given: the
   projection's output is passed as it comes) into its slot (always);
2. when (pos + 1) % m == 0 (a uniform branch: the other steps end here): after a CTA barrier (the slot
   row is read back), pools per channel tile (softmax of the gate logits over the block's rows, times
   kv; ratio 4 reads the previous block's rows through channels [0, hd) and this block's through
   [hd, 2hd)) into a scratch row, barrier, shifts an overlapping block (rows m..2m-1 become 0..m-1),
   finishes the pooled row (_triton_entry._finish) and writes it into cache slot pos // m.

The twin is dsv4/ops/compress.compress_token_ref (compress_step_both, then compress_entry_ref). What
differs is the fp32 summation order of the pooling and of the norm's mean, and the approximate rsqrt.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4.kernels._pdl import launch_args, pdl_wait
from dsv4.kernels._triton_entry import _finish, finish_args, finishes

TILE = 4096  # state elements per pooling tile (rows x channels) of each of kv and z


@triton.jit
def _token_kernel(kvn_ptr, zn_ptr, ape_ptr, st_ptr, pos_ptr, pool_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr,
                  HD, C, eps, skn, szn, sape, sb, ss, sob, sos,
                  M: tl.constexpr, R: tl.constexpr, OVERLAP: tl.constexpr, APE: tl.constexpr, CB: tl.constexpr,
                  BC: tl.constexpr,
                  RD: tl.constexpr, ROUND: tl.constexpr, BLOCK: tl.constexpr, LOG: tl.constexpr, KB: tl.constexpr,
                  IB: tl.constexpr, HSCALE: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    b = tl.program_id(0)
    pos = tl.load(pos_ptr)
    slot = pos % M
    if OVERLAP:
        slot += M
    row = st_ptr + b * sb  # state [slots, 2, C]: kv at +0, the gate logits at +C
    cc = tl.arange(0, CB)
    okc = cc < C
    tl.store(row + slot * ss + cc, tl.load(kvn_ptr + b * skn + cc, mask=okc), mask=okc)
    z_new = tl.load(zn_ptr + b * szn + cc, mask=okc)
    if APE:  # the gate logits' absolute-position term of the token's row in its block
        z_new += tl.load(ape_ptr + (pos % M) * sape + cc, mask=okc)
    tl.store(row + slot * ss + C + cc, z_new, mask=okc)
    if (pos + 1) % M == 0:
        tl.debug_barrier()  # the slot row is read back by other threads
        r = tl.arange(0, R)
        half = r * 0
        if OVERLAP:  # this block's rows read channels [hd, 2hd)
            half = (r >= M).to(tl.int32) * HD
        for j0 in tl.range(0, HD, BC):
            j = j0 + tl.arange(0, BC)
            at = r[:, None] * ss + half[:, None] + j[None, :]
            m = (j < HD)[None, :] & (r[:, None] < R)
            z = tl.load(row + C + at, mask=m, other=0.0)
            kv = tl.load(row + at, mask=m, other=0.0)
            e = tl.exp(z - tl.max(z, axis=0)[None, :])
            tl.store(pool_ptr + b * HD + j, tl.sum(e / tl.sum(e, axis=0)[None, :] * kv, axis=0), mask=j < HD)
        tl.debug_barrier()  # every read of the block is done, and the pooled row is visible
        if OVERLAP:  # the completed block becomes the previous one: rows [m, 2m) -> [0, m), kv and z
            for k0 in tl.range(0, M * ss, CB):
                k = k0 + cc
                tl.store(row + k, tl.load(row + M * ss + k, mask=k < M * ss), mask=k < M * ss)
        c = tl.arange(0, BLOCK)
        ok = c < HD
        dt: tl.constexpr = out_ptr.dtype.element_ty
        x = tl.load(pool_ptr + b * HD + c, mask=ok, other=0.0)
        y = _finish(x, c, ok, w_ptr, cos_ptr, sin_ptr, HD, eps, dt, RD, ROUND, BLOCK, LOG, KB, IB, HSCALE)
        tl.store(out_ptr + b * sob + (pos // M) * sos + c, y.to(dt), mask=ok)


def applies(both: torch.Tensor, out: torch.Tensor, ratio: int, overlap: bool, rope_dim: int, rounding: str) -> bool:
    """The kernel's cases: a contiguous fp32 state [B, slots, 2, c*hd] (slots = 2m overlapping, else m),
    and what the finish takes (_triton_entry.finishes)."""
    if both.dim() != 4 or both.dtype != torch.float32 or not both.is_contiguous() or both.shape[2] != 2:
        return False
    B, slots, _, C = both.shape
    hd = C // 2 if overlap else C
    return (slots == (2 * ratio if overlap else ratio) and slots & (slots - 1) == 0 and (not overlap or C % 2 == 0)
            and finishes(B, hd, out, rope_dim, rounding))


def compress_token(kv_new: torch.Tensor, z_new: torch.Tensor, both: torch.Tensor, pos: torch.Tensor,
                   out: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ratio: int,
                   overlap: bool, eps: float, rounding: str, ape: torch.Tensor | None = None) -> None:
    """compress_token_ref in one launch on the current stream (state and cache written in place); cos, sin:
    the RoPE angles of the block's position, [rd / 2] fp32; ape [m, c*hd] fp32 added to z_new's row pos % m."""
    rd = 2 * cos.numel()
    B, slots, _, C = both.shape
    if (not applies(both, out, ratio, overlap, rd, rounding) or sin.numel() != cos.numel()
            or kv_new.shape != (B, C) or z_new.shape != (B, C) or (ape is not None and ape.shape != (ratio, C))):
        raise ValueError(f"compress_token: state {tuple(both.shape)} {both.dtype}, new {tuple(kv_new.shape)}, "
                         f"out {tuple(out.shape)}, rd {rd}, rounding {rounding!r}")
    kv_new, z_new = (t if t.stride(-1) == 1 else t.contiguous() for t in (kv_new.float(), z_new.float()))
    hd = C // 2 if overlap else C
    scratch = torch.empty(B, hd, dtype=torch.float32, device=both.device)  # the pooled rows
    bc = min(triton.next_power_of_2(hd), max(16, TILE // slots))
    with torch.cuda.device(both.device) if both.is_cuda else contextlib.nullcontext():
        _token_kernel[(B,)](kv_new, z_new, z_new if ape is None else ape.float().contiguous(), both, pos, scratch,
                            weight.contiguous(), cos.float().contiguous(), sin.float().contiguous(), out, hd, C, eps,
                            kv_new.stride(0), z_new.stride(0), 0 if ape is None else C, both.stride(0), both.stride(1),
                            out.stride(0), out.stride(1), M=ratio, R=slots, OVERLAP=overlap, APE=ape is not None, CB=triton.next_power_of_2(C), BC=bc, **finish_args(hd, rd, rounding),
                            num_warps=4, **launch_args(both))
