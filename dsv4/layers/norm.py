"""RMSNorm with the statistic and the weight applied in fp32, output in the input's dtype."""

from __future__ import annotations

import torch
from torch import nn


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, in fp32."""
    x = x.float()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.bfloat16, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (rms(x, self.eps) * self.weight.float()).to(x.dtype)
