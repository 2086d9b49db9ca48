"""Decode sparse attention with a sink in three short Triton launches per layer (bfloat16 mode).

`layers/attention.sparse_attention` at decode is two fp32 batched matmuls (cuBLAS: logits and the
probability-weighted keys), a masked softmax with the sink column, and the casts between them: on an
H200 nine launches, about 24 us per layer at batch 1. A decode step has few (sequence, head tile)
pairs (4 at batch 1), so one program per pair streams the keys alone (30 us measured, session 6);
here the keys are split across programs as flash-decoding does, in three passes:
1. per split: the max m_s and the sum l_s of exp(logit - m_s) over its keys (the sink counted in split 0);
2. per split: the global max and sum from all splits' (m_s, l_s), then p = exp(logit - m) / l rounded to
   bf16 as the reference rounds its probs, and the split's partial o = p @ keys (K = V), in fp32;
3. per (head, sequence, D chunk): o = the partials summed (a fixed tree).
The splits are sized so the grid holds about four programs per SM (`split_tiles`).

Numerics: q and keys are bf16 and p is rounded to bf16, so every product is exact in fp32 and the
tensor-core dots accumulate in fp32; what differs from the reference is fp32 summation order (the
softmax's sum per key tile and per split, the output per split). Deterministic: fixed tiles, splits
and order, no atomics. Used for bf16 q/keys/probs and one query per sequence; anything else keeps the
reference path.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from dsv4.kernels._pdl import launch_args, pdl_wait
from dsv4.ops.attention import key_count

BLOCK_H = 16  # heads per program (the smallest tl.dot M)
BLOCK_N = 32  # keys per tile: a [D, 32] bf16 tile is 32 KB at D = 512


@triton.jit
def _rows(k_ptr, c_ptr, sel_ptr, rn, N, W, skn, scn, SRC: tl.constexpr):
    """Pointers to keys rn: rows of k (SRC 0); or k's first W rows (the window) followed by the
    compressed entries c in order (SRC 1) or picked by sel (SRC 2), read where they are: no key copy."""
    if SRC == 0:
        return k_ptr + rn * skn
    j = rn - W
    if SRC == 2:
        j = tl.load(sel_ptr + j, mask=(j >= 0) & (rn < N), other=0)
    return tl.where(rn < W, k_ptr + rn * skn, c_ptr + j * scn)


@triton.jit
def _logits(q, rows, m_ptr, rn, rd, N, scale):
    """This key tile's masked, scaled logits [BLOCK_H, BLOCK_N] and its keys^T [D, BLOCK_N]."""
    kt = tl.load(rows[None, :] + rd[:, None], mask=rn[None, :] < N, other=0.0)
    ok = tl.load(m_ptr + rn, mask=rn < N, other=0) != 0
    s = tl.dot(q, kt) * scale
    return tl.where(ok[None, :], s, float("-inf")), kt


@triton.jit
def _split_stats(q_ptr, k_ptr, c_ptr, sel_ptr, m_ptr, sink_ptr, st_ptr, H, N, W, S, scale, sqb, sqh, skb, skn,
                 scb, scn, ssb, smb, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                 TILES: tl.constexpr, SRC: tl.constexpr, PDL: tl.constexpr):
    """Pass 1, one program per (head tile, sequence, key split): the split's softmax max m_s and sum
    l_s = sum exp(logit - m_s) (split 0 counts the sink column) -> st [B, S, 2, H] fp32."""
    pdl_wait(PDL)
    b = tl.program_id(1)
    sp = tl.program_id(2)
    rh = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    rd = tl.arange(0, D)
    h_ok = rh < H
    q = tl.load(q_ptr + b * sqb + rh[:, None] * sqh + rd[None, :], mask=h_ok[:, None], other=0.0)
    sink = tl.load(sink_ptr + rh, mask=h_ok, other=0.0).to(tl.float32)
    m = tl.where(sp == 0, sink, float("-inf"))
    l = tl.where(sp == 0, 1.0, 0.0) + tl.zeros((BLOCK_H,), tl.float32)  # exp(sink - m) with m = sink
    for t in range(TILES):
        rn = (sp * TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = _rows(k_ptr + b * skb, c_ptr + b * scb, sel_ptr + b * ssb, rn, N, W, skn, scn, SRC)
        s, kt = _logits(q, rows, m_ptr + b * smb, rn, rd, N, scale)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a split with no key yet: l stays 0
        l = l * tl.exp(m - safe) + tl.sum(tl.exp(s - safe[:, None]), axis=1)
        m = m_new
    st = st_ptr + (b * S + sp) * 2 * H + rh
    tl.store(st, m, mask=h_ok)
    tl.store(st + H, l, mask=h_ok)


@triton.jit
def _split_out(q_ptr, k_ptr, c_ptr, sel_ptr, m_ptr, st_ptr, part_ptr, H, N, W, S, scale, sqb, sqh, skb, skn,
               scb, scn, ssb, smb, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
               TILES: tl.constexpr, SRC: tl.constexpr, S_P2: tl.constexpr, PDL: tl.constexpr):
    """Pass 2: the softmax's max and sum over all splits (the sink's split included), then this split's
    probabilities, rounded to bf16 as the reference rounds them, times its keys -> part [B, S, H, D] fp32."""
    pdl_wait(PDL)
    b = tl.program_id(1)
    sp = tl.program_id(2)
    rh = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    rd = tl.arange(0, D)
    rs = tl.arange(0, S_P2)
    h_ok = rh < H
    ok = (rs[:, None] < S) & h_ok[None, :]
    st = st_ptr + (b * S + rs[:, None]) * 2 * H + rh[None, :]
    ms = tl.load(st, mask=ok, other=float("-inf"))
    m = tl.max(ms, axis=0)  # finite: split 0 holds the sink
    l = tl.sum(tl.load(st + H, mask=ok, other=0.0) * tl.exp(ms - m[None, :]), axis=0)
    q = tl.load(q_ptr + b * sqb + rh[:, None] * sqh + rd[None, :], mask=h_ok[:, None], other=0.0)
    acc = tl.zeros((BLOCK_H, D), dtype=tl.float32)
    for t in range(TILES):
        rn = (sp * TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = _rows(k_ptr + b * skb, c_ptr + b * scb, sel_ptr + b * ssb, rn, N, W, skn, scn, SRC)
        s, kt = _logits(q, rows, m_ptr + b * smb, rn, rd, N, scale)
        p = (tl.exp(s - m[:, None]) / l[:, None]).to(tl.bfloat16)
        acc = tl.dot(p, tl.trans(kt), acc)
    tl.store(part_ptr + ((b * S + sp) * H + rh[:, None]) * D + rd[None, :], acc, mask=h_ok[:, None])


@triton.jit
def _split_sum(part_ptr, o_ptr, cos_ptr, sin_ptr, H, S, sob, soh, D: tl.constexpr, BLOCK_D: tl.constexpr,
               S_P2: tl.constexpr, RD: tl.constexpr, PDL: tl.constexpr):
    """Pass 3, one program per (head, sequence, D chunk): o = the splits' partial outputs summed (one
    [S, BLOCK_D] load, a fixed reduction tree: deterministic), in o's dtype. One program per (sequence,
    head tile) looping over the splits took 17 us at batch 1 (20 dependent 32 KB loads). With RD > 0 the
    last RD features then get the inverse RoPE at the query position (cos, sin [RD / 2]), on o rounded to
    o's dtype first, as layers/rope.apply_rope(o, inverse=True) does after the attention."""
    pdl_wait(PDL)
    h = tl.program_id(0)
    b = tl.program_id(1)
    rd = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    rs = tl.arange(0, S_P2)
    part = tl.load(part_ptr + ((b * S + rs[:, None]) * H + h) * D + rd[None, :], mask=rs[:, None] < S, other=0.0)
    o = tl.sum(part, axis=0).to(o_ptr.dtype.element_ty)
    if RD > 0:
        x, y = tl.split(tl.reshape(o.to(tl.float32), (BLOCK_D // 2, 2)))  # the interleaved pairs (2i, 2i + 1)
        i = (tl.program_id(2) * BLOCK_D + 2 * tl.arange(0, BLOCK_D // 2) - (D - RD)) // 2
        roped = i >= 0
        c = tl.load(cos_ptr + i, mask=roped, other=1.0)
        s = tl.load(sin_ptr + i, mask=roped, other=0.0)
        pair = tl.join(x * c + y * s, y * c - x * s)  # rotation by -angle
        rot = tl.reshape(pair, (BLOCK_D,)).to(o_ptr.dtype.element_ty)
        o = tl.where(rd >= D - RD, rot, o)
    tl.store(o_ptr + b * sob + h * soh + rd, o)


def _sms(t: torch.Tensor) -> int:
    if not t.is_cuda:
        return 132
    return torch.cuda.get_device_properties(t.device).multi_processor_count


def split_tiles(n_tiles: int, programs: int, sms: int) -> int:
    """Key tiles per split: one where (head tiles x sequences x splits) fills about four programs per
    SM, more where one tile each would make more programs than that (batch 16 at two splits of ten
    tiles: 33 us, latency of the serial tile loop)."""
    return max(1, -(-n_tiles * programs // (4 * sms)))


def _rows_after_window(q, keys, mask, comp, sel) -> int:
    """The number of keys N (window rows, then the compressed entries read in place), or ValueError."""
    B, H, D = q.shape
    N = key_count(keys, comp, sel)
    bad = (q.dtype != torch.bfloat16 or keys.dtype != torch.bfloat16 or keys.shape != (B, keys.shape[1], D)
           or mask.shape != (B, N) or D & (D - 1) or D < 16
           or (comp is not None and (comp.dtype != keys.dtype or comp.shape[0] != B or comp.shape[2] != D
                                     or comp.stride(-1) != 1))
           or (sel is not None and (comp is None or sel.shape[0] != B or sel.dtype not in (torch.int32, torch.int64))))
    if bad:
        raise ValueError(f"sparse_attention: q {q.dtype} {tuple(q.shape)}, keys {keys.dtype} {tuple(keys.shape)}, "
                         f"mask {tuple(mask.shape)}, comp {None if comp is None else tuple(comp.shape)}")
    return N


def _rope_args(cos, sin, D: int):
    if cos is None:
        return 0, None, None
    if sin is None or sin.numel() != cos.numel() or 2 * cos.numel() > D or cos.numel() & (cos.numel() - 1):
        raise ValueError(f"sparse_attention: cos/sin of {cos.numel()} angles for head_dim {D}")
    return 2 * cos.numel(), cos.float().contiguous(), sin.float().contiguous()


def sparse_attention(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, sink: torch.Tensor, scale: float,
                     cos: torch.Tensor | None = None, sin: torch.Tensor | None = None, comp: torch.Tensor | None = None,
                     sel: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, D] bf16, keys [B, N, D] bf16, mask [B, N] bool, sink [H] -> o [B, H, D] bf16, with
    bf16-rounded probabilities (see the module docstring). With comp [B, NC, D], keys is the window
    [B, W, D] and the keys are its rows followed by comp's entries, all NC in order or the K that sel
    [B, K] picks (N = W + NC or W + K), read where they lie. With cos, sin [RD / 2] fp32 (one query
    position for the batch), o's last RD features are rotated back by the inverse RoPE."""
    B, H, D = q.shape
    N = _rows_after_window(q, keys, mask, comp, sel)
    rope, cos, sin = _rope_args(cos, sin, D)
    q = q if q.stride(-1) == 1 else q.contiguous()
    keys = keys if keys.stride(-1) == 1 else keys.contiguous()
    m8 = mask.view(torch.uint8) if mask.dtype == torch.bool else mask  # same bytes: no copy kernel
    m8 = m8 if m8.stride(-1) == 1 else m8.contiguous()
    src = 0 if comp is None else 1 if sel is None else 2
    c = keys if comp is None else comp
    sl = m8 if sel is None else sel.contiguous()
    n_tiles = triton.cdiv(N, BLOCK_N)
    tiles = split_tiles(n_tiles, triton.cdiv(H, BLOCK_H) * B, _sms(q))
    S = triton.cdiv(n_tiles, tiles)
    st = torch.empty(B, S, 2, H, dtype=torch.float32, device=q.device)
    part = torch.empty(B, S, H, D, dtype=torch.float32, device=q.device)
    o = torch.empty(B, H, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(H, BLOCK_H), B, S)
    common = (H, N, keys.shape[1], S, scale, q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), c.stride(0),
              c.stride(1), sl.stride(0), m8.stride(0))
    meta = {"D": D, "BLOCK_H": BLOCK_H, "BLOCK_N": BLOCK_N, "TILES": tiles, "SRC": src, "num_warps": 4,
            **launch_args(q)}
    bd = min(D, max(16, 4096 // triton.next_power_of_2(S)))  # at most 4096 partial values a program
    bd = max(bd, triton.next_power_of_2(rope)) if rope else bd  # the roped features in one chunk's tail
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        _split_stats[grid](q, keys, c, sl, m8, sink.float().contiguous(), st, *common, **meta)
        _split_out[grid](q, keys, c, sl, m8, st, part, *common, S_P2=triton.next_power_of_2(S), **meta)
        _split_sum[(H, B, D // bd)](part, o, cos if rope else o, sin if rope else o, H, S, o.stride(0), o.stride(1),
                                    D=D, BLOCK_D=bd, S_P2=triton.next_power_of_2(S), RD=rope, num_warps=4,
                                    **launch_args(q))
    return o
