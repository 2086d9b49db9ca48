"""The MoE gate's routing in torch ops: the twin of dsv4/kernels/_triton_gate.py, and the top-k rule it shares."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def topk_index_order(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of each row of x [R, n] -> (values, indices [R, k]) in ascending index order, ties at the
    k-th value to the lowest indices: a stable descending sort keeps the lowest indices among ties."""
    idx = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k].sort(dim=-1).values
    return x.gather(-1, idx), idx


def gate_scores(logits: torch.Tensor) -> torch.Tensor:
    """sqrt(softplus(logits)), fp32."""
    return torch.sqrt(F.softplus(logits))


def normalized(scores: torch.Tensor, idx: torch.Tensor, route_scale: float) -> torch.Tensor:
    """The scores at the picks idx [N, k], normalized to sum 1, times route_scale."""
    w = scores.gather(-1, idx)
    return w / w.sum(-1, keepdim=True) * route_scale


def moe_gate_ref(logits: torch.Tensor, bias: torch.Tensor, k: int, route_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A learned gate's (weights [N, k] fp32, indices [N, k]) from its fp32 logits [N, E]: the top-k of
    scores + bias (the bias only chooses) in index order, the weights from the unbiased scores."""
    scores = gate_scores(logits)
    idx = topk_index_order(scores + bias.float(), k)[1]
    return normalized(scores, idx, route_scale), idx
