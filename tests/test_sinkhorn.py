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
