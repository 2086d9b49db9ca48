"""Decode sparse attention with a sink in one Triton launch per layer (bfloat16 mode).

`layers/attention.sparse_attention` at decode is two fp32 batched matmuls (cuBLAS: logits and the
probability-weighted keys), a masked softmax with the sink column, and the casts between them:
on an H200 about 24 us per layer at batch 1 and 60 at batch 16 (flash, 43 layers: ~1 and ~2.6 ms a
step). Here one program holds BLOCK_H heads of one sequence and streams the keys twice:
1. logits = q.k * scale (masked keys -inf) -> the running max m and denominator l of the softmax over
   [logits, sink] (online: l is rescaled when m grows);
2. the same logits -> p = exp(logit - m) / l, rounded to bf16 as the reference rounds its probs,
   and o += p @ keys (K = V).

Numerics: q and keys are bf16 and p is rounded to bf16, so every product is exact in fp32 and the
tensor-core dots accumulate in fp32; what differs from the reference is fp32 summation order (the
softmax's sum is accumulated per key tile, with the online rescaling). Deterministic: fixed tiles and
order, no atomics. Used for bf16 q/keys/probs and one query per sequence; anything else keeps the
reference path.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4.kernels._pdl import launch_args, pdl_wait

BLOCK_H = 16  # heads per program (the smallest tl.dot M)
BLOCK_N = 32  # keys per tile: a [D, 32] bf16 tile is 32 KB at D = 512


@triton.jit
def _logits(q, k_ptr, m_ptr, rn, rd, N, skn, scale):
    """This key tile's masked, scaled logits [BLOCK_H, BLOCK_N] and its keys^T [D, BLOCK_N]."""
    kt = tl.load(k_ptr + rn[None, :] * skn + rd[:, None], mask=rn[None, :] < N, other=0.0)
    ok = tl.load(m_ptr + rn, mask=rn < N, other=0) != 0
    s = tl.dot(q, kt) * scale
    return tl.where(ok[None, :], s, float("-inf")), kt


@triton.jit
def _sparse_attention_kernel(q_ptr, k_ptr, m_ptr, sink_ptr, o_ptr, H, N, scale, sqb, sqh, skb, skn, smb, sob, soh,
                             D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
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
    grid = (triton.cdiv(H, BLOCK_H), B)
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        _sparse_attention_kernel[grid](q, keys, m8, sink.float().contiguous(), o, H, N, scale, q.stride(0),
                                       q.stride(1), keys.stride(0), keys.stride(1), m8.stride(0), o.stride(0),
                                       o.stride(1), D=D, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, num_warps=4,
                                       num_stages=2, **launch_args(q))
    return o
