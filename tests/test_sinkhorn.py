"""The one-launch mHC Sinkhorn: its op is the twin on the CPU and under torch.compile (the Triton
kernel itself: tests/test_triton_interpret.py on the CPU, tests/test_fuse_gpu.py on a GPU)."""

from __future__ import annotations

import torch

from dsv4 import kernels
from dsv4.kernels import ops
from dsv4.layers import mhc
from dsv4.ops.sinkhorn import sinkhorn_ref


def _logits(rng, T, hc):
    return torch.randn(T, hc, hc, generator=rng) * 3


def test_the_comb_is_doubly_stochastic_within_eps(rng):
    c = sinkhorn_ref(torch.randn(7, 4, 4, generator=rng, dtype=torch.float64), 100, 1e-6)  # logits of the
    # model's scale: converged well within 100 rounds (spread-out logits, x3, can need far more)
    assert torch.allclose(c.sum(-2), torch.ones(7, 4, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(c.sum(-1), torch.ones(7, 4, dtype=torch.float64), atol=1e-5)


def test_op_is_the_twin_on_cpu_eager_and_compiled(rng):
    x = _logits(rng, 5, 4)
    want = sinkhorn_ref(x, 20, 1e-6)
    assert torch.equal(ops.sinkhorn(x, 20, 1e-6), want)
    compiled = torch.compile(lambda t: ops.sinkhorn(t * 1.0, 20, 1e-6), dynamic=False)
    assert torch.equal(compiled(x), want)  # the fake impl traced, the op ran as one opaque call


def test_dispatcher_leaves_cpu_and_kernels_off_to_the_twin(rng):
    x = _logits(rng, 3, 4)
    before = kernels.use(True)
    try:
        assert kernels.sinkhorn(x, 20, 1e-6) is None  # CPU tensors
    finally:
        kernels.use(before)
    mixes = torch.randn(2, 1, 24, generator=rng)
    pre, post, comb = mhc.sinkhorn_split(mixes, torch.rand(3, generator=rng), torch.randn(24, generator=rng),
                                         4, 20, 1e-6)
    assert comb.shape == (2, 1, 4, 4) and pre.shape == post.shape == (2, 1, 4)


def test_hc_pre_through_the_mixes_and_comb_ops_is_the_plain_path(rng, monkeypatch):
    """mhc.hc_pre wired through the mixes op and the comb op (as on CUDA with the kernels on: here the
    dispatchers are told they apply, and the ops run their CPU twins) gives the plain path's sublayer input,
    post and comb, with the comb op on and off (DSV4_TRITON_COMB); what the GPU adds is the kernels'
    summation order, tested against float64 on their own."""
    B, hc, d = 2, 4, 64
    X = torch.randn(B, 1, hc, d, generator=rng).bfloat16()
    fn = torch.randn(2 * hc + hc * hc, hc * d, generator=rng) * 0.05
    scale, base = torch.rand(3, generator=rng), torch.randn(2 * hc + hc * hc, generator=rng)
    plain = mhc.hc_pre(X, fn, scale, base, hc, 20, 1e-3, 1e-6)
    monkeypatch.setattr(kernels, "_applies", lambda x: True)
    for comb in ("1", "0"):
        monkeypatch.setenv("DSV4_TRITON_COMB", comb)
        monkeypatch.setenv("DSV4_TRITON_MIXES", "1")
        calls = []
        real = ops.hc_comb
        monkeypatch.setattr(ops, "hc_comb", lambda *a: calls.append(1) or real(*a))
        got = mhc.hc_pre(X, fn, scale, base, hc, 20, 1e-3, 1e-6)
        assert len(calls) == (comb == "1")
        assert torch.equal(got[0], plain[0]) or (got[0].float() - plain[0].float()).abs().max() <= 2 ** -7
        for g, p in zip(got[1:], plain[1:]):
            assert ((g - p).abs().max() / p.abs().max()).item() < 1e-5, comb
