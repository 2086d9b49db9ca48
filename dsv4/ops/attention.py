"""Sparse attention with a sink: the reference form (the twin of dsv4/kernels/_triton_attention.py)."""

from __future__ import annotations

import torch


def sparse_attention_ref(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None, sink: torch.Tensor,
                         scale: float, probs_dtype: torch.dtype) -> torch.Tensor:
    """softmax(q.k * scale) over the allowed keys, with exp(sink[h]) added to the denominator: two fp32
    einsums around the masked softmax. q [B,T,H,D], keys [B,N,D] (K = V), mask [B,T,N] bool or None
    -> o [B,T,H,D]; the probabilities are rounded to probs_dtype before weighting the keys."""
    logits = torch.einsum("bthd,bnd->bthn", q.float(), keys.float()) * scale
    if mask is not None:
        logits = logits.masked_fill(~mask.unsqueeze(2), float("-inf"))
    sink_col = sink.float().view(1, 1, -1, 1).expand(*logits.shape[:-1], 1)
    probs = torch.cat((logits, sink_col), dim=-1).softmax(dim=-1)[..., :-1]
    o = torch.einsum("bthn,bnd->bthd", probs.to(probs_dtype).float(), keys.float())
    return o.to(q.dtype)


def key_count(window: torch.Tensor, comp: torch.Tensor | None, sel: torch.Tensor | None) -> int:
    """How many keys `window_then_entries` lists: the window's rows, then all of comp's or sel's picks."""
    return window.shape[1] + (0 if comp is None else sel.shape[1] if sel is not None else comp.shape[1])


def window_then_entries(window: torch.Tensor, comp: torch.Tensor | None, sel: torch.Tensor | None) -> torch.Tensor:
    """The decode keys as one tensor: the window's rows [B, W, D], then comp's entries [B, NC, D], all in
    order or the ones sel [B, K] picks (the attention kernels read them where they lie instead)."""
    if comp is None:
        return window
    if sel is not None:
        comp = comp.gather(1, sel.unsqueeze(-1).expand(-1, -1, comp.shape[-1]))
    return torch.cat((window, comp), 1)


def finish_qkv(q: torch.Tensor, kv: torch.Tensor, kv_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               q_eps: float, kv_eps: float, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The projections' outputs finished: q [..., H, D] scaled by its per-head RMS in q's dtype (as released:
    each op rounds), kv [..., D] RMS-normed with kv_weight in fp32, both RoPE'd (cos, sin broadcast over
    the leading dims of kv; over the heads for q), kv rounded as round_kv ("kv") or not ("none")."""
    from dsv4.layers.norm import rms
    from dsv4.layers.rope import apply_rope
    from dsv4.ops.kvquant import round_kv

    q = q * torch.rsqrt(q.square().mean(-1, keepdim=True) + q_eps)
    q = apply_rope(q, cos.unsqueeze(-2), sin.unsqueeze(-2))
    kv = apply_rope((rms(kv, kv_eps) * kv_weight.float()).to(kv.dtype), cos, sin)
    if rounding == "kv":
        kv = round_kv(kv, 2 * cos.shape[-1])
    return q, kv


def attention_entry_ref(q: torch.Tensor, kv: torch.Tensor, kv_weight: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, pos: torch.Tensor, window: torch.Tensor, q_eps: float, kv_eps: float,
                        rounding: str) -> torch.Tensor:
    """Decode's finish_qkv with the window write: q [B, H * D] (fp32 or the window's dtype) -> [B, H, D] in the
    window's dtype; kv [B, D] finished into
    window[:, pos % W] (cos, sin [rd / 2] of the query position): the twin of the one-launch kernel
    (dsv4/kernels/_triton_qkv.py)."""
    from dsv4.cache import write_slot

    q, kv = q.to(window.dtype), kv.to(window.dtype)  # the projections' outputs as Linear rounds them
    q, kv = finish_qkv(q.unflatten(-1, (-1, kv.shape[-1])), kv, kv_weight, cos, sin, q_eps, kv_eps, rounding)
    write_slot(window, (pos % window.shape[1]).view(1), kv)
    return q


def finish_index_q(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rounding: bool) -> torch.Tensor:
    """The indexer's queries [..., H, hd] RoPE'd (cos, sin broadcast over the heads), then round_index where
    the model simulates the released rounding."""
    from dsv4.layers.rope import apply_rope
    from dsv4.ops.kvquant import round_index

    q = apply_rope(q, cos.unsqueeze(-2), sin.unsqueeze(-2))
    return round_index(q) if rounding else q


def index_query_ref(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """Decode's indexer queries from the projection's output q [B, H * hd] (rounded to dtype first, as Linear
    does) -> [B, H, hd], RoPE'd and rounded: the twin of dsv4/kernels/_triton_qkv.index_query."""
    return finish_index_q(q.to(dtype).unflatten(-1, (-1, head_dim)), cos, sin, True)
