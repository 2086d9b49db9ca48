"""Mixture of experts: sqrt-softplus gate, bias-corrected or hashed top-k, clamped SwiGLU experts.

Scores s = sqrt(softplus(x W_g^T)) in fp32. Learned layers pick the top-k of s + bias (the bias
only chooses); hash layers (the first n_hash_layers) look the experts up by token id in tid2eid.
Weights = s at the chosen experts, normalised to sum 1, times route_scale, and applied BEFORE w2.
The reference dispatch below loops over the experts that received tokens: counts come back to the
host, which is exactly the data-dependent shape a graph cannot hold (see dsv4/decode/ for the
graph-ready dispatch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dsv4 import kernels
from dsv4.config import ModelConfig
from dsv4.layers.linear import Linear, no_reduce, rows_forward
from dsv4.ops.gate import gate_scores, normalized


class Gate(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, device=None):
        super().__init__()
        self.topk, self.route_scale = cfg.n_activated_experts, cfg.route_scale
        self.hash = cfg.is_hash_layer(layer_id)
        self.weight = nn.Parameter(torch.zeros(cfg.n_routed_experts, cfg.dim, dtype=torch.bfloat16, device=device),
                                   requires_grad=False)
        if self.hash:
            self.register_buffer("tid2eid", torch.zeros(cfg.vocab_size, self.topk, dtype=torch.int64, device=device))
        else:
            self.bias = nn.Parameter(torch.zeros(cfg.n_routed_experts, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N,d], ids [N] -> routing weights [N,k] fp32, expert indices [N,k]."""
        logits = kernels.bf16_dense_gemv(x.float(), self.weight)
        if logits is None:
            logits = x.float() @ self.weight.float().t()
        if not self.hash:
            routed = kernels.moe_gate(logits, self.bias, self.topk, self.route_scale)  # one launch, or None
            if routed is not None:
                return routed
        scores = gate_scores(logits)
        if self.hash:
            idx = self.tid2eid[ids]
        else:
            biased = scores + self.bias.float()
            top = kernels.topk(biased, self.topk)  # one Triton launch (index order), or None: torch.topk
            idx = top[1] if top is not None else biased.topk(self.topk, dim=-1).indices
        return normalized(scores, idx, self.route_scale), idx


def swiglu(g: torch.Tensor, u: torch.Tensor, limit: float | None) -> torch.Tensor:
    """silu(g) * u with the released clamp (u in [-limit, limit], g <= limit) when limit is set."""
    if limit:
        u, g = u.clamp(-limit, limit), g.clamp(max=limit)
    return F.silu(g) * u


class Expert(nn.Module):
    """SwiGLU with the released clamp: u in [-limit, limit], gate <= limit; weight before w2."""

    def __init__(self, cfg: ModelConfig, inter: int, fmt: str, device=None):
        super().__init__()
        self.limit, self.act_dtype = cfg.swiglu_limit, cfg.act_dtype
        self.w1 = Linear(cfg.dim, inter, fmt, cfg, device)
        self.w3 = Linear(cfg.dim, inter, fmt, cfg, device)
        self.w2 = Linear(inter, cfg.dim, fmt, cfg, device)

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        g, u = rows_forward(self, ("w1", "w3"), x, torch.float32)  # one GEMV when stacked
        a = swiglu(g, u, self.limit)
        if weight is not None:
            a = a * weight.unsqueeze(-1)
        return self.w2(a.to(self.act_dtype), out_dtype=torch.float32)


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, device=None):
        super().__init__()
        self.n_experts, self.act_dtype = cfg.n_routed_experts, cfg.act_dtype
        self.gate = Gate(cfg, layer_id, device)
        self.experts = nn.ModuleList(Expert(cfg, cfg.moe_inter_dim, cfg.expert_fmt, device)
                                     for _ in range(cfg.n_routed_experts))
        self.shared_experts = Expert(cfg, cfg.moe_inter_dim * cfg.n_shared_experts, cfg.weight_fmt, device)
        # Tensor parallel (dsv4/decode/parallel.py) changes three things: expert_ids are the global
        # ids this rank holds (self.experts[e] takes a global id), shared_experts is this rank's
        # slice of it or None, and reduce sums the ranks' partial outputs.
        self.expert_ids = range(cfg.n_routed_experts)
        self.reduce = no_reduce

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x, ids = x.flatten(0, -2), ids.flatten()
        weights, idx = self.gate(x, ids)
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        counts = torch.bincount(idx.flatten(), minlength=self.n_experts).tolist()
        for e in self.expert_ids:
            if counts[e] == 0:
                continue
            rows, slot = torch.where(idx == e)
            y.index_add_(0, rows, self.experts[e](x[rows], weights[rows, slot]))
        if self.shared_experts is not None:
            y += self.shared_experts(x)
        return self.reduce(y).to(self.act_dtype).view(shape)
