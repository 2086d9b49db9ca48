"""The mHC comb kernel (from the mixes kernel's sums, dsv4/kernels/_triton_sinkhorn.comb) on the GPU."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("T", [1, 16])
def test_comb_kernel_is_one_launch_matching_float64_and_replays(T, rng):
    """flash's hc 4 from fresh sums: one launch, within 1e-5 of the float64 twin, graph replay equal."""
    from torch.profiler import ProfilerActivity, profile

    from dsv4.kernels import _triton_sinkhorn as K
    from dsv4.ops.sinkhorn import comb_from_sums_ref

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    hc, Kf = 4, 4 * 4096
    J = 2 * hc + hc * hc
    sums = torch.randn(T, J + 1, generator=rng) * 30
    sums[:, J] = torch.rand(T, generator=rng) * Kf * 4 + 1
    sums = sums.cuda()
    scale, base = torch.rand(3, generator=rng).cuda(), torch.randn(J, generator=rng).cuda()
    y = K.comb(sums, scale, base, Kf, 1e-6, hc, 20, 1e-6)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        y = K.comb(sums, scale, base, Kf, 1e-6, hc, 20, 1e-6)
        torch.cuda.synchronize()
    assert [e.name for e in prof.events() if e.device_type.name == "CUDA"] == ["_comb_kernel"]
    r = comb_from_sums_ref(sums.double(), scale.double(), base.double(), Kf, 1e-6, hc, 20, 1e-6)
    assert ((y.double() - r).abs().max() / r.abs().max()).item() < 1e-5
    out = torch.empty_like(y)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out.copy_(K.comb(sums, scale, base, Kf, 1e-6, hc, 20, 1e-6))
    sums.copy_(sums.flip(0) * 0.5)
    g.replay()
    assert torch.equal(out, K.comb(sums, scale, base, Kf, 1e-6, hc, 20, 1e-6))
