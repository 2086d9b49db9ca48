"""The mHC Sinkhorn normalization in pure torch: the twin of the fused kernel, and the reference.

softmax over each row + eps, one column normalization, then iters-1 (row, column) rounds, every
division by (sum + eps). Each round depends on whole rows or columns of the last one, so a
compiler turns every normalization into its own kernel (78 per flash layer).
dsv4/kernels/_triton_sinkhorn.py keeps the matrix in registers instead.
"""

from __future__ import annotations

import torch


def sinkhorn_ref(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """[..., hc, hc] logits -> the doubly-stochastic comb, in the logits' dtype."""
    comb = logits.softmax(-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return comb
