"""Sparse attention with a sink over a sliding window plus compressed blocks (reference path).

All layers share the query/KV projections and the grouped low-rank output; they differ in which
KV each query sees: the last `window_size` tokens, plus (ratio 128) every visible compressed block
or (ratio 4) the indexer's top-k visible blocks. K = V (one shared head of head_dim), so the
output is rotated back by the inverse RoPE at the query position.

This is the reference path: it states the released algorithm with Python-int positions and
host-side branches (a compressor block completes or not). `dsv4/decode/` holds the graph-ready one.
"""

from __future__ import annotations

import torch
from torch import nn

from dsv4 import kernels
from dsv4.cache import AttentionCache
from dsv4.config import ModelConfig
from dsv4.layers.compressor import Compressor
from dsv4.layers.indexer import Indexer
from dsv4.layers.linear import Linear, no_reduce, rows_forward
from dsv4.layers.norm import RMSNorm
from dsv4.layers.rope import apply_rope, rope_angles, rope_frequencies
from dsv4.ops.attention import finish_qkv, sparse_attention_ref

PREFILL_CHUNK = 256  # queries per attention chunk: bounds the [B, chunk, H, keys] logits


def sparse_attention(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None, sink: torch.Tensor,
                     scale: float, probs_dtype: torch.dtype) -> torch.Tensor:
    """softmax(q.k * scale) over the allowed keys, with exp(sink[h]) added to the denominator.

    q [B,T,H,D], keys [B,N,D] (K = V), mask [B,T,N] bool or None -> o [B,T,H,D]. One kernel launch
    at bf16 decode with the kernels on (dsv4/kernels/_triton_attention.py), else the reference.
    """
    o = kernels.sparse_attention(q, keys, mask, sink, scale, probs_dtype)
    return sparse_attention_ref(q, keys, mask, sink, scale, probs_dtype) if o is None else o


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, device=None):
        super().__init__()
        self.cfg = cfg
        self.ratio = cfg.ratio(layer_id)
        H, D, G, fmt = cfg.n_heads, cfg.head_dim, cfg.o_groups, cfg.weight_fmt
        self.n_heads, self.head_dim, self.groups = H, D, G
        self.scale = D ** -0.5
        freqs = rope_frequencies(cfg, self.ratio, device)
        self.register_buffer("freqs", freqs, persistent=False)
        self.wq_a = Linear(cfg.dim, cfg.q_lora_rank, fmt, cfg, device)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps, device)
        self.wq_b = Linear(cfg.q_lora_rank, H * D, fmt, cfg, device)
        self.wkv = Linear(cfg.dim, D, fmt, cfg, device)
        self.kv_norm = RMSNorm(D, cfg.norm_eps, device)
        self.wo_a = Linear(H // G * D, G * cfg.o_lora_rank, fmt, cfg, device)
        self.wo_b = Linear(G * cfg.o_lora_rank, cfg.dim, fmt, cfg, device)
        self.attn_sink = nn.Parameter(torch.zeros(H, device=device), requires_grad=False)
        self.compressor = Compressor(cfg, self.ratio, D, freqs, "kv", device) if self.ratio else None
        self.indexer = Indexer(cfg, freqs, device) if self.ratio == 4 else None
        self.cache: AttentionCache | None = None
        # Sums the ranks' partial wo_b outputs when the heads are split (dsv4/decode/parallel.py).
        self.reduce = no_reduce

    # ------------------------------------------------------------ shared pieces
    def project(self, x: torch.Tensor, pos: torch.Tensor):
        """Queries [B,T,H,D] (per-head RMS, roped), window KV [B,T,D] (roped, rounded), q latent."""
        q, kv, qr = self.project_linear(x)
        cos, sin = rope_angles(pos, self.freqs)
        q, kv = finish_qkv(q.unflatten(-1, (self.n_heads, self.head_dim)), kv, self.kv_norm.weight, cos, sin,
                           self.cfg.norm_eps, self.kv_norm.eps, "kv" if self.cfg.simulate_quant else "none")
        return q, kv, qr

    def project_linear(self, x: torch.Tensor, out_dtype: torch.dtype | None = None):
        """The projections alone: q [B,T,H*D] before its RMS and RoPE, kv [B,T,D] before its norm (both in
        out_dtype, the model dtype by default: fp32 leaves their rounding to the consumer), q latent."""
        qa, kv = rows_forward(self, ("wq_a", "wkv"), x, out_dtype)  # one GEMV when the decoder stacked them
        qr = self.q_norm(qa.to(self.cfg.act_dtype))
        return self.wq_b(qr, out_dtype), kv, qr

    def output(self, o: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Inverse RoPE at the query position, block-diagonal wo_a per group, then wo_b."""
        return self.project_out(self.unrope(o, pos))

    def unrope(self, o: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """o [B,T,H,D] rotated back by the inverse RoPE at its query positions pos [T]."""
        cos, sin = rope_angles(pos, self.freqs)
        return apply_rope(o, cos.unsqueeze(-2), sin.unsqueeze(-2), inverse=True)

    def project_out(self, o: torch.Tensor) -> torch.Tensor:
        """Block-diagonal wo_a per group, then wo_b, of the un-roped o.

        wo_b's fp32 result goes through `reduce` before the cast, so a tensor-parallel rank's
        partial sum over its groups is summed with the others' and rounded once, like the
        unsharded product."""
        # no FP8 rounding of o here: the released model runs wo_a as a bf16 einsum (its convert.py
        # dequantizes wo_a to bf16), unlike every other FP8 projection
        o = o.flatten(2).unflatten(-1, (self.groups, -1)).to(self.cfg.act_dtype)
        y = self.grouped_wo_a(o).to(self.cfg.act_dtype)
        return self.reduce(self.wo_b(y.flatten(2), out_dtype=torch.float32)).to(self.cfg.act_dtype)

    def grouped_wo_a(self, o: torch.Tensor) -> torch.Tensor:
        """o [B,T,G,H/G*D] -> fp32 [B,T,G,o_lora]: group g through rows g*o_lora.. of wo_a."""
        lin, G = self.wo_a, self.groups
        R = lin.out_features // G
        if lin.fmt == "fp8" and R % 128 == 0:  # each group's rows are whole 128-row scale blocks
            y = kernels.dense_gemv(o, lin.weight, lin.scale, groups=G)  # all groups in one launch
            if y is not None:
                return y.unflatten(-1, (G, R))
        wa = lin.dequantized().unflatten(0, (G, -1))  # [G, o_lora, H/G*D]
        return torch.einsum("btgk,gok->btgo", o.float(), wa)

    def attend(self, q, keys, mask):
        return sparse_attention(q, keys, mask, self.attn_sink, self.scale, self.cfg.act_dtype)

    # ------------------------------------------------------------ prefill
    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        """A new sequence of T tokens at positions 0..T-1; fills this layer's cache."""
        B, T, _ = x.shape
        cache, W, dev = self.cache, self.cfg.window_size, x.device
        cache.reset()
        t = torch.arange(T, device=dev)
        q, kv, qr = self.project(x, t)
        keys = [kv]
        masks = [((t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - W)).expand(B, T, T)]
        if self.ratio:
            comp = self.compressor.prefill(x, cache.comp_state)
            nb = comp.shape[1]
            cache.comp[:, :nb] = comp
            visible = (torch.arange(nb, device=dev)[None, :] < ((t + 1) // self.ratio)[:, None]).expand(B, T, nb)
            if self.indexer is not None:
                visible = visible & self.prefill_selection(x, qr, t, visible)
            keys.append(comp)
            masks.append(visible)
        keys, mask = torch.cat(keys, dim=1), torch.cat(masks, dim=2)
        o = torch.cat([self.attend(q[:, s:s + PREFILL_CHUNK], keys, mask[:, s:s + PREFILL_CHUNK])
                       for s in range(0, T, PREFILL_CHUNK)], dim=1)
        last = torch.arange(max(T - W, 0), T, device=dev)
        cache.window[:, last % W] = kv[:, last]
        return self.output(o, t)

    def prefill_selection(self, x, qr, t, visible) -> torch.Tensor:
        """[B,T,nb] mask of the indexer's top-k among each query's visible blocks."""
        keys = self.indexer.compressor.prefill(x, self.cache.index_state)
        nb = keys.shape[1]
        self.cache.index_keys[:, :nb] = keys
        k = min(self.indexer.topk, nb)
        chosen = torch.zeros_like(visible)
        if k:
            iq, iw = self.indexer.queries(x, qr, t)
            scores = Indexer.scores(iq, iw, keys).masked_fill(~visible, float("-inf"))
            chosen.scatter_(-1, scores.topk(k, dim=-1).indices, True)
        return chosen

    # ------------------------------------------------------------ decode
    def decode(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """One token per sequence at Python-int position pos."""
        cache, W, m = self.cache, self.cfg.window_size, self.ratio
        p = torch.tensor([pos], device=x.device)
        q, kv, qr = self.project(x, p)
        cache.window[:, pos % W] = kv[:, 0]
        keys = [cache.window[:, :min(pos + 1, W)]]
        if m:
            entry = self.compressor.decode(x, pos, cache.comp_state)
            if entry is not None:
                cache.comp[:, pos // m] = entry[:, 0]
            visible = cache.comp[:, :(pos + 1) // m]
            if self.indexer is not None:
                visible = self.decode_selection(x, qr, pos, p, visible)
            keys.append(visible)
        return self.output(self.attend(q, torch.cat(keys, dim=1), None), p)

    def decode_selection(self, x, qr, pos: int, p, visible) -> torch.Tensor:
        """The indexer's top-k of the visible compressed entries for this query."""
        entry = self.indexer.compressor.decode(x, pos, self.cache.index_state)
        if entry is not None:
            self.cache.index_keys[:, pos // 4] = entry[:, 0]
        n = visible.shape[1]
        k = min(self.indexer.topk, n)
        if k == 0:
            return visible
        iq, iw = self.indexer.queries(x, qr, p)
        scores = Indexer.scores(iq, iw, self.cache.index_keys[:, :n])
        idx = scores[:, 0].topk(k, dim=-1).indices
        return visible.gather(1, idx.unsqueeze(-1).expand(-1, -1, visible.shape[-1]))
