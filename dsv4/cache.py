"""Decode-time state of one attention layer, preallocated for a batch and max_seq_len.

- window: ring buffer of `window_size` KV slots; position p lives in slot p % window_size.
- comp: compressed KV entries, entry j covers positions [j*m, (j+1)*m); ceil(max_seq_len/m) slots,
  since the graph-ready path writes (masked) into the slot of the block being filled.
- comp_state / index_state: a compressor's partial block (kv and gate logits, fp32). Ratio 4
  (overlapping) keeps 2m slots: the last complete block (read through its `a` channels) and the
  block being filled; ratio 128 keeps m slots. kv and score are two views of one buffer `both`
  ([B, slots, 2, c*hd]): the graph-ready step writes a token's slot and shifts a completed block with one
  op each on `both` instead of one per tensor (under inductor each mutated buffer costs a kernel).
- index_keys: the indexer's own compressed keys (ratio-4 layers).
Nothing here is reallocated during decode, which is what lets a graph replay read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4.config import ModelConfig


def write_slot(buf: torch.Tensor, slot: torch.Tensor, value: torch.Tensor, keep: torch.Tensor | None = None) -> None:
    """buf[:, slot] = value (value [B, ...]); with `keep` (bool scalar) the old row stays where keep: the
    graph-ready step's cache writes, position on the device."""
    if keep is not None:
        value = torch.where(keep, buf.index_select(1, slot).squeeze(1), value)
    buf.index_copy_(1, slot, value.unsqueeze(1).to(buf.dtype))


@dataclass
class CompressorState:
    kv: torch.Tensor     # [B, slots, c*hd] fp32 (a view of both[:, :, 0])
    score: torch.Tensor  # [B, slots, c*hd] fp32, -inf where empty (a view of both[:, :, 1])
    both: torch.Tensor   # [B, slots, 2, c*hd] fp32: kv and score of each slot side by side

    @classmethod
    def allocate(cls, batch: int, ratio: int, width: int, device) -> "CompressorState":
        slots = 2 * ratio if ratio == 4 else ratio
        c = 2 if ratio == 4 else 1
        both = torch.empty(batch, slots, 2, c * width, device=device)
        st = cls(both[:, :, 0], both[:, :, 1], both)
        st.reset()
        return st

    def reset(self) -> None:
        self.kv.zero_()
        self.score.fill_(float("-inf"))


@dataclass
class AttentionCache:
    window: torch.Tensor                      # [B, W, head_dim]
    comp: torch.Tensor | None = None          # [B, max_seq // m, head_dim]
    comp_state: CompressorState | None = None
    index_keys: torch.Tensor | None = None    # [B, max_seq // 4, index_head_dim]
    index_state: CompressorState | None = None
    capacity: int = 0                         # the max_seq_len it was sized for

    @classmethod
    def allocate(cls, cfg: ModelConfig, ratio: int, batch: int, device) -> "AttentionCache":
        dt = cfg.act_dtype
        cache = cls(window=torch.zeros(batch, cfg.window_size, cfg.head_dim, dtype=dt, device=device),
                    capacity=cfg.max_seq_len)
        if ratio:
            cache.comp = torch.zeros(batch, -(-cfg.max_seq_len // ratio), cfg.head_dim, dtype=dt, device=device)
            cache.comp_state = CompressorState.allocate(batch, ratio, cfg.head_dim, device)
        if ratio == 4:
            cache.index_keys = torch.zeros(batch, -(-cfg.max_seq_len // 4), cfg.index_head_dim, dtype=dt, device=device)
            cache.index_state = CompressorState.allocate(batch, 4, cfg.index_head_dim, device)
        return cache

    @property
    def batch(self) -> int:
        return self.window.shape[0]

    def reset(self) -> None:
        for t in (self.window, self.comp, self.index_keys):
            if t is not None:
                t.zero_()
        for st in (self.comp_state, self.index_state):
            if st is not None:
                st.reset()
