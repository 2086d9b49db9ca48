"""Gated pooling of every m tokens into one KV entry (ratio 128), or of 2m overlapping ones (ratio 4).

Every token t contributes kv_t = x_t Wkv^T and gate logits z_t = x_t Wgate^T + ape[t mod m] (fp32).
Ratio 128: entry j = sum over block j of softmax_t(z) * kv, per channel. Ratio 4: projections are
2*hd wide; entry j pools 2m rows per channel: block j-1 through channels [0, hd) ("a") and block j
through [hd, 2hd) ("b"); before block 0 the a-rows are kv=0 with z=-inf. The pooled entry goes
through the model dtype, RMSNorm and RoPE at position j*m, then the layer's simulated rounding (bfloat16 mode).

While a block is incomplete the compressor emits nothing and keeps kv and z in CompressorState.
"""

from __future__ import annotations

import torch
from torch import nn

from dsv4.cache import CompressorState
from dsv4.config import ModelConfig
from dsv4.layers.linear import Linear, rows_forward
from dsv4.layers.norm import RMSNorm
from dsv4.layers.rope import apply_rope, rope_angles
from dsv4.ops.compress import pool_rows
from dsv4.ops.kvquant import round_index, round_kv


class Compressor(nn.Module):
    def __init__(self, cfg: ModelConfig, ratio: int, width: int, freqs: torch.Tensor,
                 rounding: str, device=None):
        super().__init__()
        self.ratio, self.width, self.overlap = ratio, width, ratio == 4
        c = 2 if self.overlap else 1
        self.act_dtype = cfg.act_dtype
        self.wkv = Linear(cfg.dim, c * width, "bf16", cfg, device)
        self.wgate = Linear(cfg.dim, c * width, "bf16", cfg, device)
        self.ape = nn.Parameter(torch.zeros(ratio, c * width, device=device), requires_grad=False)
        self.norm = RMSNorm(width, cfg.norm_eps, device)
        self.register_buffer("freqs", freqs, persistent=False)
        self.rounding = rounding if cfg.simulate_quant else "none"  # "kv" | "index" | "none"
        self.rope_dim = cfg.rope_head_dim

    def project(self, x: torch.Tensor, pos) -> tuple[torch.Tensor, torch.Tensor]:
        """kv and gate logits (with the absolute-position ape) of tokens at positions `pos`."""
        kv, z = self.project_raw(x)
        return kv, self.add_ape(z, pos)

    def add_ape(self, z: torch.Tensor, pos) -> torch.Tensor:
        """The gate logits of tokens at positions `pos` plus the ape row of their place in the block."""
        return z + self.ape[pos % self.ratio]

    def project_raw(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """kv and gate logits without the ape (fp32): one GEMV when stacked."""
        return rows_forward(self, ("wkv", "wgate"), x, torch.float32)

    def pool(self, kv: torch.Tensor, z: torch.Tensor, first_block) -> torch.Tensor:
        """[B, n, rows, c*hd] blocks (rows = 2m for ratio 4, else m) -> [B, n, hd] finished entries (entry index first_block + i).

        first_block may be an int or a device scalar (graph-ready path).
        """
        return self.finish(pool_rows(kv, z, self.ratio, self.overlap), first_block)

    def finish(self, pooled: torch.Tensor, first_block) -> torch.Tensor:
        """[B, n, hd] fp32 pooled blocks -> entries: model dtype, RMSNorm, RoPE at the block's position, rounding."""
        n = pooled.shape[1]
        pos = (torch.arange(n, device=pooled.device) + first_block) * self.ratio
        cos, sin = rope_angles(pos, self.freqs)
        entry = apply_rope(self.norm(pooled.to(self.act_dtype)), cos[None], sin[None])
        if self.rounding == "kv":
            return round_kv(entry, self.rope_dim)
        return round_index(entry) if self.rounding == "index" else entry

    # ---------------------------------------------------------------- prefill
    def prefill(self, x: torch.Tensor, state: CompressorState) -> torch.Tensor:
        """All complete blocks of a new sequence x [B,T,d] -> [B, T//m, hd]; the rest goes to state."""
        B, T, _ = x.shape
        m = self.ratio
        kv, z = self.project(x, torch.arange(T, device=x.device))
        nb = T // m
        state.reset()
        kb, zb = kv[:, :nb * m].unflatten(1, (nb, m)), z[:, :nb * m].unflatten(1, (nb, m))
        if self.overlap:  # rows: previous block (a channels used) then this block (b channels used)
            prev_k = torch.cat((torch.zeros_like(kb[:, :1]), kb[:, :-1]), dim=1)
            prev_z = torch.cat((torch.full_like(zb[:, :1], float("-inf")), zb[:, :-1]), dim=1)
            entries = self.pool(torch.cat((prev_k, kb), dim=2), torch.cat((prev_z, zb), dim=2), 0)
        else:
            entries = self.pool(kb, zb, 0)
        rest = T - nb * m
        off = m if self.overlap else 0
        if self.overlap and nb:
            state.kv[:, :m], state.score[:, :m] = kb[:, -1], zb[:, -1]
        state.kv[:, off:off + rest], state.score[:, off:off + rest] = kv[:, nb * m:], z[:, nb * m:]
        return entries

    # ---------------------------------------------------------------- decode
    def decode(self, x: torch.Tensor, pos: int, state: CompressorState) -> torch.Tensor | None:
        """One token at Python-int position pos; returns entry pos // m when its block completes."""
        m = self.ratio
        kv, z = self.project(x, torch.tensor([pos], device=x.device))
        slot = (m if self.overlap else 0) + pos % m
        state.kv[:, slot], state.score[:, slot] = kv[:, 0], z[:, 0]
        if (pos + 1) % m:
            return None
        entry = self.pool(state.kv[:, None], state.score[:, None], pos // m)
        if self.overlap:
            state.kv[:, :m], state.score[:, :m] = state.kv[:, m:].clone(), state.score[:, m:].clone()
        return entry
