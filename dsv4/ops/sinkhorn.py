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


def mixes_from_sums(sums: torch.Tensor, K: int, eps: float) -> torch.Tensor:
    """The mixes kernel's output [..., J + 1] (the J dot products with hc_fn, then the sum of squares of
    the K flattened stream features) -> the mixes rms(x) @ hc_fn^T [..., J]."""
    J = sums.shape[-1] - 1
    return sums[..., :J] * torch.rsqrt(sums[..., J:] / K + eps)


def comb_logits(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, hc: int) -> torch.Tensor:
    """The Sinkhorn's input from the mixes: the last hc * hc, times scale[2], plus their base -> [..., hc, hc]."""
    return (mixes[..., 2 * hc:] * scale[2] + base[2 * hc:]).unflatten(-1, (hc, hc))


def comb_from_sums_ref(sums: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, K: int, norm_eps: float, hc: int,
                       iters: int, eps: float) -> torch.Tensor:
    """The comb straight from the mixes kernel's sums: the twin of the one-launch comb kernel."""
    logits = comb_logits(mixes_from_sums(sums, K, norm_eps), scale.float(), base.float(), hc)
    return sinkhorn_ref(logits, iters, eps)
