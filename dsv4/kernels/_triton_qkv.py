"""The attention's queries and window key finished in one Triton launch, with the window-cache write.

After the q/kv projections a decode layer still runs, in torch ops, the per-head RMS of the queries
(in the model dtype, as released), their RoPE, the KV norm, its RoPE and the KV rounding, then the
window slot's write: under inductor on the H200 that is seven small kernels per layer (session 16's
listing), each a launch and a grid ramp on the step's critical path. Here one program per (row, head)
finishes one query head, and one more program per row finishes the key and writes it into the window
slot pos % W, each in the roundings the torch path makes:

    q head (the projection's output rounded to bf16 as Linear does, then eager bf16 ops, each rounded):
    s = bf16(q^2); m = bf16(sum(s) / D); t = bf16(m + eps); r = bf16(rsqrt(t)); y = bf16(q * r); the last
    rd features rotated (pairs (2i, 2i+1), fp32, then bf16);
    key: Compressor-style finish (dsv4/kernels/_triton_entry._finish): RMSNorm in fp32 with the weight,
    bf16, RoPE, then the KV rounding (e4m3 with a UE8M0 scale per 64 on the first D - rd features).

What differs from the torch path is fp32 summation order in the two means and the approximate rsqrt.

The indexer's queries (ratio-4 layers) take the same shortcut in `index_query`: one program per (row,
head) rounds the projection's output to bf16, applies the RoPE, the Walsh-Hadamard rotation (times
hd^-1/2, bf16) and the e2m1 rounding with a UE8M0 scale per 32 (round_index), where torch ops took
six launches.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4.kernels._pdl import launch_args, pdl_wait
from dsv4.kernels._triton_entry import INDEX_BLOCK, _finish, _hadamard, _rope, _round_e2m1, finish_args


@triton.jit
def _qkv_kernel(q_ptr, kv_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, qo_ptr, win_ptr, D, W, inv_d, q_eps, kv_eps,
                sqb, skb, sob, soh, swb, sws, H: tl.constexpr, RD: tl.constexpr, ROUND: tl.constexpr,
                BLOCK: tl.constexpr, LOG: tl.constexpr, KB: tl.constexpr, IB: tl.constexpr, HSCALE: tl.constexpr,
                PDL: tl.constexpr):
    pdl_wait(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    c = tl.arange(0, BLOCK)
    ok = c < D
    dt: tl.constexpr = qo_ptr.dtype.element_ty
    if h < H:  # one query head
        x = tl.load(q_ptr + b * sqb + h * D + c, mask=ok, other=0.0).to(dt).to(tl.float32)  # as Linear's cast
        s = (x * x).to(dt).to(tl.float32)
        m = (tl.sum(s, axis=0) * inv_d).to(dt).to(tl.float32)
        r = tl.math.rsqrt((m + q_eps).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        y = (x * r).to(dt).to(tl.float32)
        y = _rope(y, cos_ptr, sin_ptr, c, D, RD, BLOCK)
        tl.store(qo_ptr + b * sob + h * soh + c, y.to(dt), mask=ok)
    else:  # the window key, into slot pos % W
        x = tl.load(kv_ptr + b * skb + c, mask=ok, other=0.0).to(tl.float32)
        y = _finish(x, c, ok, w_ptr, cos_ptr, sin_ptr, D, kv_eps, dt, RD, ROUND, BLOCK, LOG, KB, IB, HSCALE)
        slot = tl.load(pos_ptr) % W
        tl.store(win_ptr + b * swb + slot * sws + c, y.to(dt), mask=ok)


def applies(q: torch.Tensor, kv: torch.Tensor, window: torch.Tensor, rope_dim: int, rounding: str) -> bool:
    """The kernel's cases: rows q [B, H * D] and kv [B, D] (bf16, or the projections' fp32 outputs, rounded to
    bf16 first) with unit feature stride, a bf16 window [B, W, D] with contiguous rows, an even RoPE width;
    with the KV rounding whole 64-blocks before it."""
    from dsv4.kernels._triton_entry import finishes

    if q.dim() != 2 or kv.dim() != 2 or window.dim() != 3:
        return False
    B, D = kv.shape
    return (q.shape[0] == B and D > 0 and q.shape[1] % D == 0 and window.dtype == torch.bfloat16
            and q.dtype in (torch.bfloat16, torch.float32) and kv.dtype in (torch.bfloat16, torch.float32)
            and q.stride(1) == 1 and kv.stride(1) == 1 and rounding in ("kv", "none")
            and finishes(B, D, window, rope_dim, rounding))


def attention_entry(q: torch.Tensor, kv: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    pos: torch.Tensor, window: torch.Tensor, q_eps: float, kv_eps: float, rounding: str) -> torch.Tensor:
    """q [B, H * D] -> finished q [B, H, D]; kv [B, D] finished into window[:, pos % W] (cos, sin: the
    RoPE angles of the query position, [rd / 2] fp32). One launch."""
    rd = 2 * cos.numel()
    if not applies(q, kv, window, rd, rounding) or sin.numel() != cos.numel():
        raise ValueError(f"attention_entry: q {tuple(q.shape)}, kv {tuple(kv.shape)}, window {tuple(window.shape)} "
                         f"{window.dtype}, rd {rd}, rounding {rounding!r}")
    B, D = kv.shape
    H = q.shape[1] // D
    out = q.new_empty(B, H, D, dtype=window.dtype)
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        _qkv_kernel[(B, H + 1)](q, kv, weight.contiguous(), cos.float().contiguous(), sin.float().contiguous(), pos,
                                out, window, D, window.shape[1], 1.0 / D, q_eps, kv_eps, q.stride(0), kv.stride(0),
                                out.stride(0), out.stride(1), window.stride(0), window.stride(1), H=H,
                                **finish_args(D, rd, rounding), num_warps=4, **launch_args(q))
    return out


@triton.jit
def _index_q_kernel(q_ptr, cos_ptr, sin_ptr, o_ptr, sqb, sob, soh, D: tl.constexpr, RD: tl.constexpr,
                    LOG: tl.constexpr, IB: tl.constexpr, HSCALE: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    c = tl.arange(0, D)
    dt: tl.constexpr = o_ptr.dtype.element_ty
    y = tl.load(q_ptr + b * sqb + h * D + c).to(dt).to(tl.float32)  # as Linear's cast
    y = _rope(y, cos_ptr, sin_ptr, c, D, RD, D).to(dt).to(tl.float32)
    y = (_hadamard(y, D, LOG) * HSCALE).to(dt).to(tl.float32)
    tl.store(o_ptr + b * sob + h * soh + c, _round_e2m1(y, D, IB).to(dt))


def index_query_applies(q: torch.Tensor, head_dim: int, rope_dim: int) -> bool:
    """Rows q [B, H * hd] (fp32 or bf16, unit feature stride) with hd a power of two of whole 32-blocks and
    an even RoPE width up to hd."""
    hd = head_dim
    return (q.dim() == 2 and q.dtype in (torch.float32, torch.bfloat16) and q.stride(1) == 1 and hd > 0
            and q.shape[1] % hd == 0 and hd & (hd - 1) == 0 and hd % INDEX_BLOCK == 0 and rope_dim % 2 == 0
            and 0 < rope_dim <= hd)


def index_query(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The indexer's q [B, H * hd] -> [B, H, hd] in `dtype`: RoPE (cos, sin [rd / 2] of the query position),
    then round_index; one launch."""
    rd = 2 * cos.numel()
    if not index_query_applies(q, head_dim, rd) or sin.numel() != cos.numel() or dtype != torch.bfloat16:
        raise ValueError(f"index_query: q {q.dtype} {tuple(q.shape)}, hd {head_dim}, rd {rd}, {dtype}")
    B, H = q.shape[0], q.shape[1] // head_dim
    out = q.new_empty(B, H, head_dim, dtype=dtype)
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        _index_q_kernel[(B, H)](q, cos.float().contiguous(), sin.float().contiguous(), out, q.stride(0), out.stride(0),
                                out.stride(1), D=head_dim, RD=rd, LOG=head_dim.bit_length() - 1, IB=INDEX_BLOCK,
                                HSCALE=head_dim ** -0.5, num_warps=2, **launch_args(q))
    return out
