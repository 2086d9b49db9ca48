"""Graph-ready decode attention: the reference algorithm with fixed shapes and device positions.

Every tensor shape is fixed by (batch, max_seq_len): the position is a device tensor, the window is
read whole with a mask of filled slots, a compressor block is pooled every step and written
through a mask (no None, no host branch), compressed entries are masked by visibility, and the
indexer always takes a fixed k with invisible blocks scored -inf. Nothing reads back to the host.

Split in three so CUDAGraphDecoder's `ab` mode can run the cache-touching middle eagerly:
`project` (graph A), `attend` (eager in `ab`), `output` (graph B).
"""

from __future__ import annotations

import torch

from dsv4 import kernels
from dsv4.cache import CompressorState, write_slot
from dsv4.decode.aside import compressors_aside, join_aside
from dsv4.layers.attention import Attention
from dsv4.layers.compressor import Compressor
from dsv4.layers.indexer import Indexer
from dsv4.layers.rope import rope_angles
from dsv4.ops.attention import sparse_attention_ref, window_then_entries
from dsv4.ops.compress import compress_step_both


def compressor_step(comp: Compressor, x: torch.Tensor, pos: torch.Tensor, state: CompressorState,
                    out: torch.Tensor) -> None:
    """Adds the token at `pos` to the block state; writes entry pos // m into `out` iff the block completed.
    All of it is one launch on the GPU (DSV4_TRITON_TOKEN); else the entry's finish and write are one
    (DSV4_TRITON_ENTRY) after the state update and pooling in torch ops."""
    m = comp.ratio
    kv, z = comp.project_raw(x)
    if kernels.compress_token(kv[:, 0], z[:, 0], state.both, pos, out, m, comp.overlap, comp.norm.weight,
                              comp.norm.eps, comp.freqs, comp.rounding, ape=comp.ape):
        return  # the whole step in one launch, the ape added inside
    z = comp.add_ape(z, pos.view(1))
    pooled = compress_step_both(kv[:, 0], z[:, 0], state.both, pos, m, comp.overlap)
    if kernels.compress_entry(pooled, pos, out, m, comp.norm.weight, comp.norm.eps, comp.freqs, comp.rounding):
        return  # finished and written in one launch
    entry = comp.finish(pooled[:, None], pos // m)[:, 0]
    done = ((pos + 1) % m) == 0
    write_slot(out, (pos // m).view(1), entry, keep=~done)


class StaticAttention:
    """Decode of one Attention layer over its preallocated cache, positions on the device."""

    def __init__(self, attn: Attention):
        self.attn = attn
        self.cfg = attn.cfg
        W = self.cfg.window_size
        dev = attn.freqs.device
        self.window_slots = torch.arange(W, device=dev)
        if attn.ratio:
            n = -(-self.cfg.max_seq_len // attn.ratio)
            self.comp_slots = torch.arange(n, device=dev)
            self.topk = min(attn.indexer.topk, n) if attn.indexer is not None else 0

    def project(self, x: torch.Tensor, pos: torch.Tensor):
        """attn.project; where one launch finishes q and the window key (`one_launch_entry`), the projections
        alone: `attend` finishes them."""
        if self.one_launch_entry(x):
            return self.attn.project_linear(x, torch.float32)  # the kernel rounds q and kv as Linear would
        return self.attn.project(x, pos.view(1))

    def one_launch_entry(self, x: torch.Tensor) -> bool:
        return kernels.attention_entry_applies(x, self.attn.cache.window, x.shape[0])

    def attend(self, x: torch.Tensor, q: torch.Tensor, kv: torch.Tensor, qr: torch.Tensor,
               pos: torch.Tensor) -> torch.Tensor:
        """Cache updates + sparse attention -> o [B,1,H,D], rotated back by the inverse RoPE."""
        a, cache, W = self.attn, self.attn.cache, self.cfg.window_size
        forked = bool(a.ratio) and compressors_aside(*self.compressors(), x, pos)  # beside the entry and the queries
        cos, sin = rope_angles(pos.view(1), a.freqs)  # the query position's; the kernels may rotate o back too
        if self.one_launch_entry(x):  # q and kv as projected: finished here, the key written into its slot
            q = kernels.attention_entry(q[:, 0], kv[:, 0], a.kv_norm.weight, cos[0], sin[0], pos, cache.window,
                                        self.cfg.norm_eps, a.kv_norm.eps,
                                        "kv" if self.cfg.simulate_quant else "none")[:, None]
        else:
            write_slot(cache.window, (pos % W).view(1), kv[:, 0])
        masks = [(self.window_slots <= pos).expand(x.shape[0], 1, W)]
        comp = sel = None
        if a.ratio:
            if not forked:
                compressor_step(a.compressor, x, pos, cache.comp_state, cache.comp)
            visible = self.comp_slots < (pos + 1) // a.ratio
            comp, comp_mask = cache.comp, visible.expand(x.shape[0], 1, -1)
            if a.indexer is not None:
                sel, comp_mask = self.select(x, q, qr, pos, visible, forked)
            elif forked:
                join_aside([cache.comp], [x], [q])
            masks.append(comp_mask)
        mask = torch.cat(masks, 2)
        o = kernels.sparse_attention(q, cache.window, mask, a.attn_sink, a.scale, self.cfg.act_dtype,
                                     unrope=(cos[0], sin[0]), comp=comp, sel=sel)
        if o is not None:
            return o
        keys = window_then_entries(cache.window, comp, sel)
        return a.unrope(sparse_attention_ref(q, keys, mask, a.attn_sink, a.scale, self.cfg.act_dtype), pos.view(1))

    def compressors(self) -> tuple[list[Compressor], list[CompressorState], list[torch.Tensor]]:
        """This layer's compressors with their states and caches (the attention's, then the indexer's)."""
        a, c = self.attn, self.attn.cache
        if a.indexer is None:
            return [a.compressor], [c.comp_state], [c.comp]
        return [a.compressor, a.indexer.compressor], [c.comp_state, c.index_state], [c.comp, c.index_keys]

    def select(self, x, q, qr, pos, visible, forked: bool = False):
        """Indexer top-k with a fixed k: invisible blocks score -inf and are masked -> (indices [B, k] of
        the picked compressed entries, their mask [B, 1, k]). forked: the compressors run on the side stream;
        the join comes after the queries, before the scores read the keys."""
        a, cache = self.attn, self.attn.cache
        if not forked:
            compressor_step(a.indexer.compressor, x, pos, cache.index_state, cache.index_keys)
        iq, iw = a.indexer.queries(x, qr, pos.view(1))
        if forked:
            join_aside([cache.comp, cache.index_keys], [x], [q, iq, iw])
        scores = Indexer.scores(iq, iw, cache.index_keys)[:, 0]
        scores = scores.masked_fill(~visible, float("-inf"))
        top = kernels.topk(scores, self.topk)  # one Triton launch (index order), or None: torch.topk
        values, indices = top if top is not None else scores.topk(self.topk, dim=-1)
        return indices, (values > float("-inf")).unsqueeze(1)

    def output(self, o: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.attn.project_out(o)  # attend rotated o back already
