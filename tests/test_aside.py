"""The shared expert on a side stream (dsv4/decode/aside.py), on the CPU.

The fork is forced on for CPU tensors (no stream is involved there): the ops must compute what the
inline expert computes, inductor must keep the fork ahead of the gate and the join behind the routed
experts (else nothing overlaps on a GPU), and the join must not cost a copy. Streams, capture and
replays: tests/test_aside_gpu.py.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

import dsv4
from dsv4 import kernels
from dsv4.decode import aside
from dsv4.decode.fuse import compiled
from dsv4.decode.static import StaticDecoder, StaticLayer
from static_steps import static_decode


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_forked_pieces_equal_the_inline_step(monkeypatch, rng, dtype):
    monkeypatch.setattr(kernels, "_applies", lambda x: True)  # the kernels' ops (their CPU twins), as on a GPU
    model = dsv4.load("tiny", dtype=dtype, n_layers=4, seed=int(torch.randint(0, 999, (1,), generator=rng)))
    prompt = torch.randint(0, 1024, (2, 7), generator=rng)
    ids = torch.randint(0, 1024, (5, 2), generator=rng)
    inline = static_decode(model, prompt, ids)
    calls = {"expert": 0, "compressor": 0}
    real_e, real_c = aside.shared_expert_aside, aside.compressor_aside

    def count(kind, real):
        return lambda *a: calls.__setitem__(kind, calls[kind] + 1) or real(*a)

    monkeypatch.setattr(aside, "applies", lambda x: True)
    monkeypatch.setattr(aside, "shared_expert_aside", count("expert", real_e))
    monkeypatch.setattr(aside, "compressor_aside", count("compressor", real_c))
    forked = static_decode(model, prompt, ids)
    n_comp = sum(1 + (layer.attn.indexer is not None) for layer in model.layers if layer.attn.ratio)
    assert calls == {"expert": 5 * 4, "compressor": 5 * n_comp} and n_comp >= 3
    assert torch.equal(forked, inline)
    assert not torch.equal(forked[0], forked[1])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_inductor_keeps_the_forks_early_and_the_joins_late(monkeypatch, rng, dtype):
    """In a compiled ratio-4 layer with a learned gate: the two compressors fork before the attention entry
    and join after the indexer's queries, before its top-k; the shared expert forks before the gate's GEMV
    and joins after the routed experts; no join costs a copy."""
    monkeypatch.setattr(kernels, "_applies", lambda x: True)  # the kernels' custom ops inside the graph
    monkeypatch.setattr(aside, "applies", lambda x: True)
    model = dsv4.load("tiny", dtype=dtype, n_layers=4, seed=int(torch.randint(0, 999, (1,), generator=rng)))
    dec = StaticDecoder(model, 1)
    dec.prefill(torch.randint(0, 1024, (1, 6), generator=rng))
    layer = next(m for m in dec.net.layers if not m.block.ffn.gate.hash and m.block.attn.indexer is not None)
    X = torch.randn(1, 1, model.cfg.hc_mult, model.cfg.dim, generator=rng).to(model.cfg.act_dtype)
    ids, pos = torch.randint(0, 1024, (1, 1), generator=rng), dec.pos.clone()
    torch._dynamo.reset()
    counters.clear()
    got, code = run_and_get_code(compiled(layer.forward), X, ids, pos)
    assert not counters["graph_break"], dict(counters["graph_break"])
    src = "\n".join(code)
    calls = [m.group(1) for m in re.finditer(r"torch\.ops\.dsv4\.(\w+)\.default\(", src)]
    at = lambda name: [i for i, c in enumerate(calls) if c == name]  # noqa: E731
    comp_forks, joins, (fork,) = at("compressor_aside"), at("join_aside"), at("shared_expert_aside")
    assert len(comp_forks) == 2 and len(joins) == 2, calls
    assert max(comp_forks) < joins[0]
    if dtype == "bfloat16":  # the entry, query and top-k kernels' ops (float32 takes the twins)
        assert max(comp_forks) < at("attention_entry")[0] < at("index_query")[0] < joins[0] < at("topk")[0]
    gate = at("moe_gate")[0]
    assert calls[gate - 1] == "bf16_gemv"  # the gate's GEMV
    assert fork < gate - 1 < gate < joins[1]
    if dtype == "bfloat16":  # the routed experts are the kernels' grouped op (float32 takes the twin)
        experts = at("fp4_grouped_gemv")
        assert len(experts) == 2 and gate < experts[0] < experts[1] < joins[1]
    for done in re.findall(r"torch\.ops\.dsv4\.join_aside\.default\(\[([\w, ]+)\]", src):
        for buf in done.split(", "):
            assert not re.search(rf"\b{buf}\b = .*(clone|copy)", src)  # a join adds no copy
    if dtype == "float32":
        want = StaticLayer.forward(layer, X, ids, pos)
        assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5


def test_stays_inline_without_a_gpu_or_when_switched_off(monkeypatch, rng):
    model = dsv4.load("tiny", dtype="float32", n_layers=1)
    expert = model.layers[0].ffn.shared_experts
    StaticLayer(model.layers[0])  # stacks w1 | w3
    x = torch.randn(2, model.cfg.dim, generator=rng)
    before = kernels.use(True)
    try:
        monkeypatch.setenv("DSV4_ASIDE", "1")
        assert aside.shared_aside(expert, x) is None  # CPU tensor
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
        assert aside.applies(x)
        for off in ("0", ""):  # opt-in until timed on a GPU
            monkeypatch.setenv("DSV4_ASIDE", off)
            assert not aside.applies(x)
    finally:
        kernels.use(before)
    assert aside.shared_aside(None, x) is None
