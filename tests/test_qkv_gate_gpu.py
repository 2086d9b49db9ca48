"""On a GPU: the attention entry and index query kernels (dsv4/kernels/_triton_qkv.py), the learned gate kernel (_triton_gate.py)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("B,H,rounding,src", [(1, 64, "kv", torch.float32), (16, 64, "kv", torch.bfloat16),
                                              (2, 8, "none", torch.float32)])
def test_attention_entry_kernel_follows_its_twin_in_one_launch(B, H, rounding, src, rng):
    """At flash shapes (D = 512, rd = 64, W = 128): q and the window slot within a rounding step of the twin
    (torch's CUDA bf16 ops), the other slots untouched, one launch, and a graph replay equal to a direct call
    on new inputs."""
    from torch.profiler import ProfilerActivity, profile

    from dsv4.kernels import _triton_qkv as K
    from dsv4.ops.attention import attention_entry_ref
    from entry_util import close_entries

    D, W = 512, 128
    w = (1 + 0.3 * torch.randn(D, generator=rng)).bfloat16().cuda()
    window = torch.randn(B, W, D, generator=rng).bfloat16().cuda()
    stacked = (torch.randn(B, 1024 + D, generator=rng) * 3).to(src).cuda()
    kv = stacked[:, 1024:]  # the stacked wq_a | wkv output's slice
    q = (torch.randn(B, H, D, generator=rng) * torch.exp2(torch.randint(-6, 6, (B, H, 1), generator=rng).float()))
    q = q.flatten(1).to(src).cuda()  # fp32: the projections' outputs, rounded inside
    ang = (torch.rand(32, generator=rng) * 30).cuda()
    cos, sin = ang.cos(), ang.sin()
    for p in (5, 127, 128, 1000):
        a, b, pos = window.clone(), window.clone(), torch.tensor(p, device="cuda")
        qa = attention_entry_ref(q, kv, w, cos, sin, pos, a, 1e-6, 1e-6, rounding)
        qb = K.attention_entry(q, kv, w, cos, sin, pos, b, 1e-6, 1e-6, rounding)
        close_entries(qa.flatten(1)[:, None], qb.flatten(1)[:, None], "none", ("q", p))
        close_entries(a, b, rounding, ("kv", p))
        others = torch.arange(W, device="cuda") != p % W
        assert torch.equal(b[:, others], window[:, others])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        K.attention_entry(q, kv, w, cos, sin, pos, b, 1e-6, 1e-6, rounding)
        torch.cuda.synchronize()
    assert [e.name for e in prof.events() if e.device_type.name == "CUDA"] == ["_qkv_kernel"]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = K.attention_entry(q, kv, w, cos, sin, pos, b, 1e-6, 1e-6, rounding)
    q.copy_(torch.randn(q.shape, generator=rng).cuda())
    stacked.copy_(torch.randn(stacked.shape, generator=rng).cuda())
    g.replay()
    want_win = window.clone()
    want = K.attention_entry(q, kv, w, cos, sin, pos, want_win, 1e-6, 1e-6, rounding)
    assert torch.equal(got, want) and torch.equal(b[:, p % W], want_win[:, p % W])


@pytest.mark.parametrize("N,E,k", [(1, 32, 6), (16, 32, 6), (4, 256, 8)])
def test_gate_kernel_routes_as_its_twin_in_one_launch(N, E, k, rng):
    """The learned gate after its GEMV (dsv4/kernels/_triton_gate.py): the twin's experts in index order, the
    weights within a few fp32 ulp (Triton's exp and log against torch's), one launch, graph replay."""
    from torch.profiler import ProfilerActivity, profile

    from dsv4.kernels import _triton_gate as K
    from dsv4.ops.gate import moe_gate_ref

    logits = (torch.randn(N, E, generator=rng) * 4).cuda()
    bias = (torch.randn(E, generator=rng) * 0.1).cuda()
    wa, ia = moe_gate_ref(logits, bias, k, 1.5)
    wb, ib = K.moe_gate(logits, bias, k, 1.5)
    assert torch.equal(ia, ib)
    assert torch.allclose(wa, wb, rtol=2e-6, atol=0), (wa - wb).abs().max()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        K.moe_gate(logits, bias, k, 1.5)
        torch.cuda.synchronize()
    assert [e.name for e in prof.events() if e.device_type.name == "CUDA"] == ["_gate_kernel"]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = K.moe_gate(logits, bias, k, 1.5)
    logits.copy_((torch.randn(N, E, generator=rng) * 4).cuda())
    g.replay()
    want = K.moe_gate(logits, bias, k, 1.5)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("B", [1, 16])
def test_index_query_kernel_follows_its_twin_in_one_launch(B, rng):
    """The indexer's decode queries at flash shapes (64 heads of 128, rd = 64) from the projection's fp32 output:
    within one e2m1 step of the twin (torch's CUDA ops), one launch, graph replay."""
    from torch.profiler import ProfilerActivity, profile

    from dsv4.kernels import _triton_qkv as K
    from dsv4.ops.attention import index_query_ref
    from entry_util import close_entries

    q = (torch.randn(B, 64 * 128, generator=rng) * 3).cuda()
    ang = (torch.rand(32, generator=rng) * 30).cuda()
    cos, sin = ang.cos(), ang.sin()
    close_entries(index_query_ref(q, cos, sin, 128, torch.bfloat16), K.index_query(q, cos, sin, 128, torch.bfloat16),
                  "index", B)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        K.index_query(q, cos, sin, 128, torch.bfloat16)
        torch.cuda.synchronize()
    assert [e.name for e in prof.events() if e.device_type.name == "CUDA"] == ["_index_q_kernel"]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = K.index_query(q, cos, sin, 128, torch.bfloat16)
    q.copy_(torch.randn(q.shape, generator=rng).cuda())
    g.replay()
    assert torch.equal(got, K.index_query(q, cos, sin, 128, torch.bfloat16))
