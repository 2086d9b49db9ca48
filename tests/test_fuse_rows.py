"""Fewer launches per layer, checked on the CPU through the twins (issue 15).

- fuse_rows: Linears that read one input stacked into one (wq_a | wkv, compressor wkv | wgate,
  shared w1 | w3): same outputs, parameters become views (no copy, no new state-dict keys).
- the routed experts' w1 | w3 bank: one grouped launch's twin equals the two projections.
- wo_a's groups in one FP8 call: the grouped twin equals the per-group products (float64 check).
- the FP4 and NVFP4 expert kernels are one CuTe kernel body: no 6-line block repeated in the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dsv4
from dsv4 import kernels
from dsv4.decode.static import StaticDecoder
from dsv4.layers.linear import Linear, fuse_rows, rows_forward
from dsv4.ops import gemv
from test_kernels import _fp8_weights64, random_fp8_weight, random_x


class _Owner(torch.nn.Module):
    def __init__(self, fmt, dtype, outs=(256, 128), k=256):
        super().__init__()
        cfg = dsv4.config.preset("tiny", dtype=dtype)
        for i, n in enumerate(outs):
            lin = Linear(k, n, fmt, cfg)
            lin.load_dense(torch.randn(n, k) / k ** 0.5)
            setattr(self, f"l{i}", lin)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp4"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fuse_rows_keeps_each_output(fmt, dtype):
    o = _Owner(fmt, dtype)
    x = torch.randn(3, 256).to(o.l0.act_dtype)
    want = (o.l0(x, torch.float32), o.l1(x, torch.float32))
    keys = set(o.state_dict())
    assert fuse_rows(o, ("l0", "l1"))
    got = rows_forward(o, ("l0", "l1"), x, torch.float32)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    assert set(o.state_dict()) == keys
    stack = o.fused_rows["l0+l1"].weight
    assert o.l1.weight.untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()
    o.l1.weight.zero_()  # a later load into a Linear lands in the stack
    assert not stack[256:].float().any() and stack[:256].float().any()


def test_fuse_rows_refuses_partial_fp8_scale_blocks():
    o = _Owner("fp8", "bfloat16", outs=(192, 128))
    assert not fuse_rows(o, ("l0", "l1"))
    assert getattr(o, "fused_rows", None) is None


def test_second_decoder_reuses_the_stacks():
    model = dsv4.load("tiny", dtype="float32", seed=3)
    StaticDecoder(model, 1)
    attn = model.layers[1].attn
    first = attn.fused_rows["wq_a+wkv"].weight.data_ptr()
    dec = StaticDecoder(model, 1)
    assert attn.fused_rows["wq_a+wkv"].weight.data_ptr() == first  # a view, not a second copy
    moe0 = dec.net.layers[1].moe
    assert moe0.banks["w1"]["weight"].data_ptr() == moe0.banks["w13"]["weight"].data_ptr()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_w13_bank_equals_two_projections(dtype):
    model = dsv4.load("tiny", dtype=dtype, seed=4)
    moe = StaticDecoder(model, 2).net.layers[1].moe
    assert "w13" in moe.banks
    x = torch.randn(5, model.cfg.dim).to(model.cfg.act_dtype)
    idx = torch.randint(0, model.cfg.n_routed_experts, (5,))
    g, u = moe.expert_linear("w13", x, idx).chunk(2, dim=-1)
    assert torch.equal(g, moe.expert_linear("w1", x, idx))
    assert torch.equal(u, moe.expert_linear("w3", x, idx))
    e = int(idx[0])  # the experts' own Linears read the same bytes
    assert torch.equal(moe.moe.experts[e].w3.weight, moe.banks["w13"]["weight"][e, moe.banks["w1"]["weight"].shape[1]:])


@pytest.mark.parametrize("M,G,R,K", [(1, 8, 256, 512), (3, 2, 128, 384)])
def test_fp8_grouped_twin_equals_float64(M, G, R, K):
    w, s = random_fp8_weight(G * R, K)
    x = random_x(M * G, K)
    y = gemv.fp8_gemv_ref(x, w, s, G)
    w64 = _fp8_weights64(w, s).unflatten(0, (G, R))
    ref = torch.einsum("mgk,grk->mgr", x.double().unflatten(0, (M, G)), w64).flatten(1)
    assert y.shape == (M, G * R)
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-6
    for g in range(G):  # each group as its own dense product
        part = gemv.fp8_gemv_ref(x[g::G], w[g * R:(g + 1) * R], s[g * R // 128:(g + 1) * R // 128])
        torch.testing.assert_close(y[:, g * R:(g + 1) * R], part, rtol=1e-6, atol=1e-6)


def test_grouped_dense_gemv_op_on_cpu():
    """The custom op's fallback (CPU) runs the grouped twin; the dispatcher keeps CPU on the twin."""
    w, s = random_fp8_weight(2 * 128, 256)
    x = random_x(2 * 2, 256)
    from dsv4.kernels import ops

    assert torch.equal(ops.fp8_gemv(x, w, s, 2), gemv.fp8_gemv_ref(x, w, s, 2))
    kernels.use(True)
    try:
        assert kernels.dense_gemv(x.view(2, 2, 256), w, s, groups=2) is None
    finally:
        kernels.use(None)


def test_expert_kernel_bodies_share_one_kernel():
    src = Path(kernels.__file__).with_name("_cute_gemv.py").read_text()
    assert src.count("@cute.kernel") == 3  # e2m1 experts (FP4 and NVFP4), FP8 dense, probe
    lines = [ln.strip() for ln in src.splitlines()]
    seen = {}
    for i in range(len(lines) - 5):
        win = tuple(lines[i:i + 6])
        if all(ln and not ln.startswith("#") for ln in win):
            assert win not in seen, f"lines {seen[win] + 1} and {i + 1} repeat a 6-line block"
            seen[win] = i


def test_compile_row_collects_skip_reasons_quietly(capfd):
    """The bench's compile row: inductor's cudagraph skip warnings are collected, nothing is printed,
    no logger level is lowered (lowering torch._inductor to DEBUG printed its debug logs), and torch's
    handler is back afterwards."""
    import logging

    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    from audit.bench.modes import _quiet_skips

    ind = logging.getLogger("torch._inductor")
    level, handlers = ind.level, list(ind.handlers)
    capfd.readouterr()
    with _quiet_skips() as got:
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (test)")
        logging.getLogger("torch._inductor.compile_fx").debug("a debug record that must stay unprinted")
        assert ind.level == level
    out = capfd.readouterr()
    assert got.reasons == ["skipping cudagraphs due to mutated inputs (test)"]
    assert out.out == "" and out.err == ""
    assert ind.level == level and ind.handlers == handlers
