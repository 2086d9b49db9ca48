"""Inductor fusion of the static step (dsv4/decode/fuse.py) and the kernels' custom ops, on the CPU.

The kernels' integration points are forced on for CPU tensors, so the custom ops (whose CPU
implementation is the twin) sit inside the compiled layers: this checks their fake shapes and
that dynamo traces a whole layer without a graph break. GPU behaviour: tests/test_fuse_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import dsv4
from dsv4 import kernels
from dsv4.decode.graph import CUDAGraphDecoder
from dsv4.decode.static import StaticDecoder


def _steps(dec, prompt, ids):
    dec.prefill(prompt)
    return torch.stack([dec.decode(i).clone() for i in ids])


def test_fused_eager_decode_matches_the_static_path(monkeypatch, rng):
    monkeypatch.setattr(kernels, "_applies", lambda x: True)  # the custom ops inside the compiled graphs
    model = dsv4.load("tiny", dtype="float32", n_layers=2, seed=int(torch.randint(0, 999, (1,), generator=rng)))
    prompt = torch.randint(0, 1024, (2, 9), generator=rng)
    ids = torch.randint(0, 1024, (6, 2), generator=rng)
    want = _steps(StaticDecoder(model, 2), prompt, ids)
    model.reset()
    torch._dynamo.reset()
    counters.clear()
    limit = torch._dynamo.config.recompile_limit
    dec = CUDAGraphDecoder(model, mode="eager", batch_size=2, fuse=True)
    built = counters["stats"]["unique_graphs"]
    assert torch._dynamo.config.recompile_limit == limit  # raised only while the decoder compiled
    got = _steps(dec.static, prompt, ids)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert built >= 2  # the layers and the ends really went through dynamo
    assert counters["stats"]["unique_graphs"] == built  # the steps reuse what the build compiled
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5
    assert not torch.equal(got[0], got[1])


def test_kernel_integration_points_stay_off_on_cpu(rng):
    """Switched on, CPU tensors still take the caller's twin (the dispatchers answer None)."""
    before = kernels.use(True)
    try:
        x = torch.randn(3, 64, generator=rng)
        w = torch.randn(8, 64, generator=rng).bfloat16()
        assert kernels.bf16_dense_gemv(x, w) is None
        assert kernels.dense_gemv(x.bfloat16(), w.to(torch.float8_e4m3fn), torch.ones(1, 1)) is None
    finally:
        kernels.use(before)


def test_custom_ops_fall_back_to_the_twins_on_cpu(rng):
    from dsv4.kernels import ops
    from dsv4.ops import gemv as twins
    from dsv4.ops import quantize as Q

    x = torch.randn(3, 256, generator=rng)
    w = torch.randn(40, 256, generator=rng)
    assert torch.equal(ops.bf16_gemv(x, w.bfloat16()), twins.bf16_gemv_ref(x, w.bfloat16()))
    q, s = Q.quantize_fp8_blockwise(w)
    assert torch.equal(ops.fp8_gemv(x.bfloat16(), q, s), twins.fp8_gemv_ref(x.bfloat16(), q, s))
    bank = torch.randn(4, 40, 256, generator=rng)
    qs = [Q.quantize_fp4(b) for b in bank]
    wq, sq = torch.stack([a for a, _ in qs]), torch.stack([b for _, b in qs])
    idx = torch.randint(0, 4, (3,), generator=rng)
    assert torch.equal(ops.fp4_grouped_gemv(x.bfloat16(), wq, sq, idx),
                       twins.fp4_grouped_gemv_ref(x.bfloat16(), wq, sq, idx))


def test_inductor_options_from_the_environment(monkeypatch):
    from dsv4.decode.fuse import extra_options
    from dsv4.errors import DSV4Error

    monkeypatch.setenv("DSV4_INDUCTOR", "combo_kernels=1, split_reductions=false,max_fusion_size=128")
    assert extra_options() == {"combo_kernels": True, "split_reductions": False, "max_fusion_size": 128}
    monkeypatch.setenv("DSV4_INDUCTOR", "combo_kernels")
    with pytest.raises(DSV4Error, match="name=value"):
        extra_options()
    monkeypatch.delenv("DSV4_INDUCTOR")
    assert extra_options() == {}
