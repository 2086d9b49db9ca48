"""Lightning indexer of ratio-4 layers: scores every compressed block for every query, keeps top-k.

score[t, j] = sum_h w[t, h] * ReLU(q[t, h] . k[j]) with w = weights_proj(x) / sqrt(index_head_dim *
index_heads). Keys come from the indexer's own overlapping ratio-4 compressor (width
index_head_dim); queries from the shared q latent through wq_b, with RoPE on their last dims.
"""

from __future__ import annotations

import torch
from torch import nn

from dsv4 import kernels
from dsv4.config import ModelConfig
from dsv4.layers.compressor import Compressor
from dsv4.layers.linear import Linear
from dsv4.layers.rope import rope_angles
from dsv4.ops.attention import finish_index_q


class Indexer(nn.Module):
    def __init__(self, cfg: ModelConfig, freqs: torch.Tensor, device=None):
        super().__init__()
        self.n_heads, self.head_dim, self.topk = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk
        self.simulate_quant = cfg.simulate_quant
        self.wq_b = Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, cfg.weight_fmt, cfg, device)
        self.weights_proj = Linear(cfg.dim, self.n_heads, "bf16", cfg, device)
        self.compressor = Compressor(cfg, 4, self.head_dim, freqs, "index", device)
        self.register_buffer("freqs", freqs, persistent=False)

    def queries(self, x: torch.Tensor, qr: torch.Tensor, pos) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B,T,heads,head_dim] (roped, rounded) and head weights w [B,T,heads] fp32."""
        cos, sin = rope_angles(pos, self.freqs)
        one_token = qr.dim() == 3 and qr.shape[1] == 1
        if self.simulate_quant and one_token and kernels.index_query_applies(qr, qr.shape[0]):  # one launch
            q = self.wq_b(qr, torch.float32)[:, 0]  # rounded to the model dtype inside, as Linear would
            q = kernels.index_query(q, cos[0], sin[0], self.head_dim, qr.dtype)[:, None]
        else:
            q = finish_index_q(self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim)), cos, sin,
                               self.simulate_quant)
        w = self.weights_proj(x, out_dtype=torch.float32) * (self.head_dim * self.n_heads) ** -0.5
        return q, w

    @staticmethod
    def scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """[B,T,heads,hd] x [B,N,hd] -> [B,T,N] fp32 block scores."""
        s = torch.relu(torch.einsum("bthd,bnd->bthn", q.float(), keys.float()))
        return (s * w.unsqueeze(-1)).sum(dim=2)
