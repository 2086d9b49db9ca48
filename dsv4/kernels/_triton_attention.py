"""Decode sparse attention with a sink in one or two Triton launches per layer (bfloat16 mode).

`layers/attention.sparse_attention` at decode is two fp32 batched matmuls (cuBLAS: logits and the
probability-weighted keys), a masked softmax with the sink column, and the casts between them:
on an H200 about 24 us per layer at batch 1 and 60 at batch 16 (flash, 43 layers: ~1 and ~2.6 ms a
step). Here one program holds BLOCK_H heads of one sequence and streams the keys twice:
1. logits = q.k * scale (masked keys -inf) -> the running max m and denominator l of the softmax over
   [logits, sink] (online: l is rescaled when m grows);
2. the same logits -> p = exp(logit - m) / l, rounded to bf16 as the reference rounds its probs,
   and o += p @ keys (K = V).

Split over the keys (flash-decoding) when one program per head tile would leave the GPU idle (batch
1: 4 programs for 64 heads): the probabilities must be rounded to bf16 with the softmax's global max
and denominator, as the reference rounds them, so it takes two launches. `_attn_stats_kernel` gives each
key chunk its (max, sum of exp) per head; `_attn_out_kernel` combines all chunks' pairs with the sink
into the global (m, l) (the same fixed order in every program), weights its chunk's keys and finishes
through `_triton_splitk.store_wide_tile` (the last chunk program sums the partial outputs in chunk order).

Numerics: q and keys are bf16 and p is rounded to bf16, so every product is exact in fp32 and the
tensor-core dots accumulate in fp32; what differs from the reference is fp32 summation order (the
softmax's sum is accumulated per key tile, with the online rescaling). Deterministic: fixed tiles and
order, no atomics. Used for bf16 q/keys/probs and one query per sequence; anything else keeps the
reference path.
"""

from __future__ import annotations

import contextlib

from dsv4.kernels import _triton_splitk

import torch
import triton
import triton.language as tl

BLOCK_H = 16  # heads per program (the smallest tl.dot M)
BLOCK_N = 32  # keys per tile: a [D, 32] bf16 tile is 32 KB at D = 512
TARGET_PROGRAMS = 264  # split the keys until the grid has about this many programs (2 per H200 SM)
MIN_CHUNK_TILES = 2  # key tiles per chunk at least
SPLIT_WARPS = 8  # the split kernels at D = 512: 128 / 191 registers, no spills (at 4 warps the output one spills)


@triton.jit
def _logits(q, k_ptr, m_ptr, rn, rd, N, skn, scale):
    """This key tile's masked, scaled logits [BLOCK_H, BLOCK_N] and its keys^T [D, BLOCK_N]."""
    kt = tl.load(k_ptr + rn[None, :] * skn + rd[:, None], mask=rn[None, :] < N, other=0.0)
    ok = tl.load(m_ptr + rn, mask=rn < N, other=0) != 0
    s = tl.dot(q, kt) * scale
    return tl.where(ok[None, :], s, float("-inf")), kt


@triton.jit
def _sparse_attention_kernel(q_ptr, k_ptr, m_ptr, sink_ptr, o_ptr, H, N, scale, sqb, sqh, skb, skn, smb, sob, soh,
                             D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(1)
    rh = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    rd = tl.arange(0, D)
    h_ok = rh < H
    q = tl.load(q_ptr + b * sqb + rh[:, None] * sqh + rd[None, :], mask=h_ok[:, None], other=0.0)
    k_ptr += b * skb
    m_ptr += b * smb
    m = tl.load(sink_ptr + rh, mask=h_ok, other=0.0).to(tl.float32)  # the sink column starts the max
    l = tl.full((BLOCK_H,), 1.0, tl.float32)  # exp(sink - m) with m = sink
    for n0 in range(0, N, BLOCK_N):
        s, kt = _logits(q, k_ptr, m_ptr, n0 + tl.arange(0, BLOCK_N), rd, N, skn, scale)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new[:, None]), axis=1)
        m = m_new
    acc = tl.zeros((BLOCK_H, D), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        s, kt = _logits(q, k_ptr, m_ptr, n0 + tl.arange(0, BLOCK_N), rd, N, skn, scale)
        p = (tl.exp(s - m[:, None]) / l[:, None]).to(tl.bfloat16)
        acc = tl.dot(p, tl.trans(kt), acc)
    tl.store(o_ptr + b * sob + rh[:, None] * soh + rd[None, :], acc.to(o_ptr.dtype.element_ty), mask=h_ok[:, None])


@triton.jit
def _attn_stats_kernel(q_ptr, k_ptr, m_ptr, st_ptr, H, N, CHUNK, scale, sqb, sqh, skb, skn, smb,
                       D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    """Chunk c of the keys -> (max logit, sum of exp(logit - max)) per head into st [2, B, S, H]
    ((-inf, 0) for a chunk with no unmasked key)."""
    b, c = tl.program_id(1), tl.program_id(2)
    S = tl.num_programs(2)
    rh = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    rd = tl.arange(0, D)
    h_ok = rh < H
    q = tl.load(q_ptr + b * sqb + rh[:, None] * sqh + rd[None, :], mask=h_ok[:, None], other=0.0)
    m = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_H,), tl.float32)
    end = tl.minimum(N, (c + 1) * CHUNK)
    for n0 in range(c * CHUNK, end, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        s, kt = _logits(q, k_ptr + b * skb, m_ptr + b * smb, rn, rd, end, skn, scale)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        dead = m_new == float("-inf")  # nothing unmasked yet: keep (-inf, 0) without exp(nan)
        e = tl.where(dead[:, None], 0.0, tl.exp(s - m_new[:, None]))
        l = l * tl.where(dead, 1.0, tl.exp(m - m_new)) + tl.sum(e, axis=1)
        m = m_new
    at = st_ptr + (b * S + c) * H + rh
    tl.store(at, m, mask=h_ok)
    tl.store(at + tl.num_programs(1) * S * H, l, mask=h_ok)


@triton.jit
def _attn_out_kernel(q_ptr, k_ptr, m_ptr, sink_ptr, st_ptr, o_ptr, ws_ptr, cnt_ptr, H, N, CHUNK, scale,
                     sqb, sqh, skb, skn, smb, sob, soh, split_stride,
                     D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, SP: tl.constexpr):
    """The global softmax (m, l) from all chunks' pairs and the sink, then chunk c's keys weighted by
    their bf16-rounded probabilities; the chunks' partial outputs summed in chunk order."""
    b, c = tl.program_id(1), tl.program_id(2)
    S = tl.num_programs(2)
    rh = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    rd = tl.arange(0, D)
    rs = tl.arange(0, SP)
    h_ok = rh < H
    at = st_ptr + (b * S + rs[None, :]) * H + rh[:, None]
    ok = h_ok[:, None] & (rs[None, :] < S)
    ms = tl.load(at, mask=ok, other=float("-inf"))
    ls = tl.load(at + tl.num_programs(1) * S * H, mask=ok, other=0.0)
    sink = tl.load(sink_ptr + rh, mask=h_ok, other=0.0).to(tl.float32)
    m = tl.maximum(sink, tl.max(ms, axis=1))  # finite: the sink is
    l = tl.exp(sink - m) + tl.sum(tl.where(ms == float("-inf"), 0.0, ls * tl.exp(ms - m[:, None])), axis=1)
    q = tl.load(q_ptr + b * sqb + rh[:, None] * sqh + rd[None, :], mask=h_ok[:, None], other=0.0)
    acc = tl.zeros((BLOCK_H, D), dtype=tl.float32)
    end = tl.minimum(N, (c + 1) * CHUNK)
    for n0 in range(c * CHUNK, end, BLOCK_N):
        s, kt = _logits(q, k_ptr + b * skb, m_ptr + b * smb, n0 + tl.arange(0, BLOCK_N), rd, end, skn, scale)
        p = (tl.exp(s - m[:, None]) / l[:, None]).to(tl.bfloat16)
        acc = tl.dot(p, tl.trans(kt), acc)
    offs = b * sob + rh[:, None] * soh + rd[None, :]
    _triton_splitk.store_wide_tile(acc, o_ptr, ws_ptr, cnt_ptr, offs, h_ok[:, None], S, split_stride)


def chunks(B: int, H: int, N: int) -> tuple[int, int]:
    """(S, CHUNK): S key chunks of CHUNK keys (a multiple of BLOCK_N) for B sequences of H heads."""
    tiles = triton.cdiv(N, BLOCK_N)
    programs = triton.cdiv(H, BLOCK_H) * B
    S = max(1, min(triton.cdiv(TARGET_PROGRAMS, programs), tiles // MIN_CHUNK_TILES))
    chunk = triton.cdiv(tiles, S) * BLOCK_N
    return triton.cdiv(N, chunk), chunk


def sparse_attention(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, sink: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q [B, H, D] bf16, keys [B, N, D] bf16, mask [B, N] bool, sink [H] -> o [B, H, D] bf16, with
    bf16-rounded probabilities (see the module docstring)."""
    B, H, D = q.shape
    N = keys.shape[1]
    if (q.dtype != torch.bfloat16 or keys.dtype != torch.bfloat16 or keys.shape != (B, N, D) or mask.shape != (B, N)
            or D & (D - 1) or D < 16):
        raise ValueError(f"sparse_attention: q {q.dtype} {tuple(q.shape)}, keys {keys.dtype} {tuple(keys.shape)}, "
                         f"mask {tuple(mask.shape)}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if keys.stride(-1) != 1:
        keys = keys.contiguous()
    m8 = mask.view(torch.uint8) if mask.dtype == torch.bool else mask  # same bytes: no copy kernel
    if m8.stride(-1) != 1:
        m8 = m8.contiguous()
    o = torch.empty(B, H, D, dtype=q.dtype, device=q.device)
    sink = sink.float().contiguous()
    S, chunk = chunks(B, H, N)
    grid = (triton.cdiv(H, BLOCK_H), B, S)
    strides = (q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), m8.stride(0))
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        if S == 1:
            _sparse_attention_kernel[grid[:2]](q, keys, m8, sink, o, H, N, scale, *strides, o.stride(0), o.stride(1),
                                               D=D, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, num_warps=4, num_stages=2)
            return o
        stats = torch.empty(2, B, S, H, dtype=torch.float32, device=q.device)
        _attn_stats_kernel[grid](q, keys, m8, stats, H, N, chunk, scale, *strides,
                                 D=D, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, num_warps=SPLIT_WARPS, num_stages=2)
        ws = torch.empty(S, B, H, D, dtype=torch.float32, device=q.device)
        cnt = _triton_splitk.counters(q.device, grid[0] * grid[1])
        _attn_out_kernel[grid](q, keys, m8, sink, stats, o, ws, cnt, H, N, chunk, scale, *strides, o.stride(0),
                               o.stride(1), ws.stride(0), D=D, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N,
                               SP=triton.next_power_of_2(S), num_warps=SPLIT_WARPS, num_stages=2)
    return o
