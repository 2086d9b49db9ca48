"""Manifold-constrained hyper-connections: hc_mult residual streams mixed by a Sinkhorn matrix.

Each site (attention, FFN) reads the streams through `hc_pre` (one RMS statistic, a projection
to 2*hc + hc*hc mixes, then pre/post gates and a doubly-stochastic `comb`), runs its sublayer on
the collapsed stream, and writes back through `hc_post`. The head collapses the streams once more
with `hc_head`. Everything here runs in fp32; the collapsed stream is cast to the model's dtype.
"""

from __future__ import annotations

import torch

from dsv4 import kernels
from dsv4.layers.norm import rms
from dsv4.ops.sinkhorn import comb_logits, mixes_from_sums, sinkhorn_ref


def hc_mixes(X: torch.Tensor, fn: torch.Tensor, eps: float, sums: torch.Tensor | None = None) -> torch.Tensor:
    """[B,T,hc,d] streams -> [B,T,n_mix] = (flat(X) @ fn^T) * rsqrt(mean(flat(X)^2) + eps); from the mixes
    kernel's `sums` where it ran (kernels.hc_mix_sums)."""
    if sums is None:
        return rms(X.flatten(-2), eps) @ fn.float().t()
    return mixes_from_sums(sums, fn.shape[-1], eps)


def sinkhorn_split(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, hc: int, iters: int,
                   eps: float, comb: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pre = sigmoid + eps; post = 2 sigmoid; comb = Sinkhorn-normalised exp (rows then columns), unless
    the comb kernel made it already (`comb`)."""
    scale, base = scale.float(), base.float()
    pre = torch.sigmoid(mixes[..., :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(mixes[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    if comb is None:
        logits = comb_logits(mixes, scale, base, hc)
        comb = kernels.sinkhorn(logits, iters, eps)  # one launch on CUDA with the kernels on
        comb = sinkhorn_ref(logits, iters, eps) if comb is None else comb
    return pre, post, comb


def collapse(X: torch.Tensor, pre: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """sum_k pre[k] * X[..., k, :] in fp32, cast to the model dtype."""
    return (pre.unsqueeze(-1) * X.float()).sum(-2).to(dtype)


def hc_pre(X: torch.Tensor, fn, scale, base, hc: int, iters: int, norm_eps: float, hc_eps: float):
    """Streams -> (sublayer input [B,T,d], post [B,T,hc], comb [B,T,hc,hc])."""
    sums = kernels.hc_mix_sums(X.flatten(-2), fn)  # one launch on CUDA with the kernels on
    comb = None if sums is None else kernels.hc_comb(sums, fn.shape[-1], norm_eps, scale, base, hc, iters, hc_eps)
    pre, post, comb = sinkhorn_split(hc_mixes(X, fn, norm_eps, sums), scale, base, hc, iters, hc_eps, comb)
    return collapse(X, pre, X.dtype), post, comb


def hc_post(y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """X'[i] = post[i] * y + sum_j comb[j, i] * X[j]  (comb applied transposed).

    The sum over j runs as hc explicit terms, not an einsum: with hc = 4 a batched matmul is a
    cuBLAS launch per site that a compiler cannot fuse, while these terms fuse into one pointwise
    kernel with the post term (86 fewer launches in a flash decode step)."""
    Xf = X.float()
    out = post.unsqueeze(-1) * y.float().unsqueeze(-2)
    for j in range(X.shape[-2]):
        out = out + comb[..., j, :].unsqueeze(-1) * Xf[..., j, :].unsqueeze(-2)
    return out.to(X.dtype)


def hc_head(X: torch.Tensor, fn, scale, base, norm_eps: float, hc_eps: float) -> torch.Tensor:
    """Final collapse of the streams: pre = sigmoid(mix * scale + base) + eps."""
    mixes = hc_mixes(X, fn, norm_eps, kernels.hc_mix_sums(X.flatten(-2), fn))
    pre = torch.sigmoid(mixes * scale.float()[0] + base.float()) + hc_eps
    return collapse(X, pre, X.dtype)
