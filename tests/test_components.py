"""Every DeepSeek-V4 component against a plain float64 restatement of its formula (tests/ref64.py,
written from docs/model.md), plus the behaviours a restatement alone would not pin down: Sinkhorn
marginals, the YaRN range, RoPE inversion, which compressed blocks a query may see, when the
compressor emits in decode, hash vs learned routing, and where the SwiGLU clamp and routing weight go.

Inputs and weight seeds are fresh random draws every run; failure messages carry the seed.
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import ref64 as R
import torch

import dsv4
from dsv4.cache import AttentionCache, CompressorState
from dsv4.config import preset
from dsv4.layers import mhc
from dsv4.layers.attention import sparse_attention
from dsv4.layers.norm import RMSNorm
from dsv4.layers.rope import (
    apply_rope,
    rope_angles,
    rope_frequencies,
    yarn_correction_range,
)

D = 256  # tiny hidden size






def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little") % 2**31


@pytest.fixture(scope="module")
def tiny():
    """Float32 tiny model with fresh weights: layer 0 ratio 0 / hash, 1 ratio 4 / hash,
    2 ratio 128 / learned, 3 ratio 4 / learned."""
    seed = _seed()
    model = dsv4.load("tiny", dtype="float32", seed=seed)
    model.seed = seed
    return model


_rel = R.rel


def _with_cache(attn, batch: int):
    attn.cache = AttentionCache.allocate(attn.cfg, attn.ratio, batch, "cpu")
    return attn


# ------------------------------------------------------------------ mHC
def _hc_params(n_mix: int, width: int, n_scale: int):
    return (torch.randn(n_mix, width) / math.sqrt(width), 0.5 + 0.5 * torch.rand(n_scale), 0.5 * torch.randn(n_mix))


def test_sinkhorn_marginals_and_restatement():
    mixes = torch.randn(64, 24) * 0.5
    scale, base = 0.5 + torch.rand(3), 0.3 * torch.randn(24)
    pre, post, comb = mhc.sinkhorn_split(mixes, scale, base, 4, 20, 1e-6)
    assert (comb > 0).all()
    assert (comb.sum(-2) - 1).abs().max() < 1e-5  # the last step normalises columns
    assert (comb.sum(-1) - 1).abs().max() < 1e-3  # rows: converged after 20 rounds
    logits = mixes.double()[:, 8:].view(-1, 4, 4) * scale.double()[2] + base.double()[8:].view(4, 4)
    assert _rel(comb, R.sinkhorn64(logits, 20, 1e-6)) < 1e-6
    assert _rel(pre, torch.sigmoid(mixes.double()[:, :4] * scale.double()[0] + base.double()[:4]) + 1e-6) < 1e-6
    assert _rel(post, 2 * torch.sigmoid(mixes.double()[:, 4:8] * scale.double()[1] + base.double()[4:8])) < 1e-6
    # more rounds drive the rows to 1 as well (the iteration really alternates rows and columns)
    _, _, comb100 = mhc.sinkhorn_split(mixes.double(), scale, base, 4, 100, 1e-6)
    assert (comb100.sum(-1) - 1).abs().max() < 1e-5


@pytest.mark.parametrize("iters", [1, 2, 3, 7])
def test_sinkhorn_exact_sequence_far_from_convergence(iters):
    """Sharp logits and few rounds: only the exact normalisation order (softmax over rows + eps,
    columns, then rows/columns alternately) matches."""
    mixes = torch.randn(64, 24, dtype=torch.float64) * 3
    scale, base = torch.ones(3), torch.zeros(24)
    _, _, comb = mhc.sinkhorn_split(mixes, scale, base, 4, iters, 1e-6)
    assert _rel(comb, R.sinkhorn64(mixes[:, 8:].view(-1, 4, 4), iters, 1e-6)) < 1e-12


def test_hc_pre_post_head():
    X = torch.randn(2, 5, 4, D) * 2
    fn, scale, base = _hc_params(24, 4 * D, 3)
    x, post, comb = mhc.hc_pre(X, fn, scale, base, 4, 20, 1e-6, 1e-6)
    pre64, post64, comb64 = R.hc_split64(X, fn, scale, base, 4, 20, 1e-6, 1e-6)
    assert _rel(x, R.collapse64(X, pre64)) < 1e-6
    assert _rel(post, post64) < 1e-6 and _rel(comb, comb64) < 1e-6
    y = torch.randn(2, 5, D)
    assert _rel(mhc.hc_post(y, X, post, comb), R.hc_post64(y, X, post.double(), comb.double())) < 1e-6
    # comb is applied transposed; the untransposed mix is measurably different
    assert _rel(mhc.hc_post(y, X, post, comb.transpose(-1, -2)), R.hc_post64(y, X, post64, comb64)) > 1e-3
    hfn, hscale, hbase = _hc_params(4, 4 * D, 1)
    assert _rel(mhc.hc_head(X, hfn, hscale, hbase, 1e-6, 1e-6), R.hc_head64(X, hfn, hscale, hbase, 1e-6, 1e-6)) < 1e-6


def test_rmsnorm():
    norm = RMSNorm(D)
    norm.weight.copy_((1 + 0.3 * torch.randn(D)).bfloat16())
    for mag in (1e-2, 1.0, 1e3):
        x = torch.randn(3, 7, D) * mag
        assert _rel(norm(x), R.norm64(norm, x)) < 1e-6


# ------------------------------------------------------------------ RoPE / YaRN
def test_yarn_correction_range_and_frequencies():
    assert yarn_correction_range(64, 160000, 32, 1, 65536) == (15, 25)
    assert R.yarn_range64(64, 160000, 32, 1, 65536) == (15, 25)
    flash = preset("flash")
    f_comp, f_plain = rope_frequencies(flash, 4).double(), rope_frequencies(flash, 0).double()
    base = torch.tensor([160000.0 ** (-2 * i / 64) for i in range(32)], dtype=torch.float64)
    assert _rel(f_comp[:16], base[:16]) < 1e-6  # below the range: unchanged
    assert _rel(f_comp[25:], base[25:] / 16) < 1e-6  # above it: divided by the factor
    assert _rel(f_plain, [10000.0 ** (-2 * i / 64) for i in range(32)]) < 1e-6  # ratio 0: no YaRN
    for cfg in (flash, preset("tiny")):
        for ratio in (0, 4, 128):
            assert _rel(rope_frequencies(cfg, ratio), R.freqs64(cfg, ratio)) < 1e-6


@pytest.mark.parametrize("ratio", [0, 4])
def test_rope_interleaved_and_inverse(ratio, tiny):
    freqs = rope_frequencies(tiny.cfg, ratio)
    x = torch.randn(2, 9, 3, 128)
    pos = torch.randint(0, 1000, (9,))
    cos, sin = rope_angles(pos, freqs)
    y = apply_rope(x, cos.unsqueeze(-2), sin.unsqueeze(-2))
    assert torch.equal(y[..., :64], x[..., :64])  # only the last 64 dims rotate
    assert _rel(y, R.rope64(x, pos[:, None], R.freqs64(tiny.cfg, ratio))) < 1e-5
    back = apply_rope(y, cos.unsqueeze(-2), sin.unsqueeze(-2), inverse=True)
    assert (back - x).abs().max() < 1e-5
    # interleaved: pair i is (64+2i, 64+2i+1); a unit vector on 64+2i turns into (cos, sin) of pos*f_i
    i, p = int(torch.randint(0, 32, (1,))), int(torch.randint(0, 1000, (1,)))
    e = torch.zeros(128)
    e[64 + 2 * i] = 1
    c, s = rope_angles(p, freqs)
    out = apply_rope(e, c, s)
    f = R.freqs64(tiny.cfg, ratio)[i]
    assert abs(out[64 + 2 * i] - math.cos(p * f)) < 1e-4 and abs(out[64 + 2 * i + 1] - math.sin(p * f)) < 1e-4
    assert out.abs().sum() - out[64 + 2 * i:66 + 2 * i].abs().sum() == 0


# ------------------------------------------------------------------ compressor
def _compressors(tiny):
    """name -> (compressor, config, ratio)."""
    l1, l2 = tiny.layers[1].attn, tiny.layers[2].attn
    return {"ratio4-kv": (l1.compressor, tiny.cfg, 4), "ratio4-index": (l1.indexer.compressor, tiny.cfg, 4),
            "ratio128": (l2.compressor, tiny.cfg, 128)}


@pytest.mark.parametrize("name", ["ratio4-kv", "ratio4-index", "ratio128"])
def test_compressor_prefill_matches_restatement(name, tiny):
    comp, cfg, m = _compressors(tiny)[name]
    T = m * int(torch.randint(2, 4, (1,))) + int(torch.randint(1, m, (1,)))  # ends in an incomplete block
    x = torch.randn(2, T, D)
    st = CompressorState.allocate(2, m, comp.width, "cpu")
    got = comp.prefill(x, st)
    assert got.shape == (2, T // m, comp.width)
    for b in range(2):
        assert _rel(got[b], R.compressor64(comp, x[b], R.freqs64(cfg, m))) < 1e-5, f"seed {tiny.seed}"


@pytest.mark.parametrize("name", ["ratio4-kv", "ratio128"])
def test_compressor_overlap_and_block_membership(name, tiny):
    """Ratio 4: entry j pools blocks j-1 and j (block 0's previous half is kv=0, gate -inf);
    ratio 128: entry j pools exactly block j. Changing one token changes exactly those entries."""
    comp, cfg, m = _compressors(tiny)[name]
    T = 4 * m
    x = torch.randn(1, T, D)
    base = comp.prefill(x, CompressorState.allocate(1, m, comp.width, "cpu"))
    for tok in torch.randint(0, T, (3,)).tolist():
        x2 = x.clone()
        x2[0, tok] += torch.randn(D)
        changed = (comp.prefill(x2, CompressorState.allocate(1, m, comp.width, "cpu")) != base).any(-1)[0]
        want = {tok // m} | ({tok // m + 1} if m == 4 and tok // m + 1 < 4 else set())
        assert set(changed.nonzero()[:, 0].tolist()) == want, f"token {tok}"
    if m == 4:  # entry 0 by hand: only block 0 through the b channels
        hd = comp.width
        kv = x[0, :4].double() @ R.weight64(comp.wkv).t()[:, hd:]
        z = x[0, :4].double() @ R.weight64(comp.wgate).t()[:, hd:] + comp.ape.double()[:, hd:]
        pooled = (torch.softmax(z, dim=0) * kv).sum(0)
        assert _rel(base[0, 0], R.rope64(R.norm64(comp.norm, pooled), torch.tensor(0), R.freqs64(cfg, 4))) < 1e-5


@pytest.mark.parametrize("name", ["ratio4-kv", "ratio4-index", "ratio128"])
def test_compressor_decode_emits_on_block_end(name, tiny):
    """Prefill a prefix ending mid-block, then decode: nothing until (p+1) % m == 0, and then
    exactly the entry a prefill of the whole sequence computes."""
    comp, _, m = _compressors(tiny)[name]
    p0 = int(torch.randint(1, 2 * m, (1,)))
    T = p0 + m + int(torch.randint(1, m, (1,)))  # at least one emission during decode
    x = torch.randn(2, T, D)
    full = comp.prefill(x, CompressorState.allocate(2, m, comp.width, "cpu"))
    st = CompressorState.allocate(2, m, comp.width, "cpu")
    comp.prefill(x[:, :p0], st)
    emitted = 0
    for p in range(p0, T):
        out = comp.decode(x[:, p:p + 1], p, st)
        if (p + 1) % m:
            assert out is None, f"position {p} emitted mid-block"
        else:
            emitted += 1
            assert _rel(out[:, 0], full[:, p // m]) < 1e-5, f"position {p}, seed {tiny.seed}"
    assert emitted >= 1


# ------------------------------------------------------------------ attention
@pytest.mark.parametrize("layer", [1, 2])
def test_block_visibility(layer, tiny):
    """A query at t sees compressed block j iff j < (t+1)//m: replacing the compressor's kv weights
    leaves every query before t = m-1 bit-identical and changes every query from t = m-1 on."""
    attn = _with_cache(copy.deepcopy(tiny.layers[layer].attn), 1)
    m = attn.ratio
    T = m + m // 2 + 3
    x = torch.randn(1, T, D)
    y0 = attn.prefill(x)
    attn.compressor.wkv.load_dense(torch.randn(attn.compressor.wkv.out_features, D) / 16)
    y1 = attn.prefill(x)
    assert torch.equal(y0[:, :m - 1], y1[:, :m - 1])
    diff = (y1 - y0).abs().amax(-1)[0, m - 1:]
    assert (diff > 1e-6 * y0.abs().max()).all(), diff


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_attention_prefill_matches_restatement(layer, tiny):
    attn = _with_cache(copy.deepcopy(tiny.layers[layer].attn), 2)
    T = int(torch.randint(130, 150, (1,)))
    x = torch.randn(2, T, D)
    got = attn.prefill(x)
    for b in range(2):
        assert _rel(got[b], R.attention64(attn, x[b], tiny.cfg)) < 1e-5, f"layer {layer}, seed {tiny.seed}"


def test_indexer_scores_and_topk(tiny):
    attn = _with_cache(copy.deepcopy(tiny.layers[3].attn), 1)
    T = int(torch.randint(60, 100, (1,)))
    x = torch.randn(1, T, D)
    t = torch.arange(T)
    qr = attn.q_norm(attn.wq_a(x))
    nb = T // 4
    visible = (torch.arange(nb)[None, :] < ((t + 1) // 4)[:, None])[None]
    chosen = (attn.prefill_selection(x, qr, t, visible) & visible)[0]  # as Attention.prefill combines them
    freqs = R.freqs64(tiny.cfg, 4)
    want = R.index_scores64(attn.indexer, x[0], qr[0].double(), freqs)
    iq, iw = attn.indexer.queries(x, qr, t)
    got = attn.indexer.scores(iq, iw, attn.cache.index_keys[:, :nb])[0]
    assert _rel(got, want) < 1e-5
    for i in range(T):
        vis = (i + 1) // 4
        expect = set(want[i, :vis].topk(min(8, vis)).indices.tolist()) if vis else set()
        assert set(chosen[i].nonzero()[:, 0].tolist()) == expect, f"query {i}, seed {tiny.seed}"


def test_sparse_attention_sink_in_denominator():
    B, T, H, Dh, N = 2, 5, 4, 64, 11
    q, keys = torch.randn(B, T, H, Dh), torch.randn(B, N, Dh)
    sink = torch.randn(H) * 3
    mask = torch.rand(B, T, N) < 0.5
    mask[..., 0] |= ~mask.any(-1)  # every other row sees a key (an empty row without a sink is 0/0)
    mask[0, 0] = False  # nothing visible: the sink takes all the mass, the output is exactly 0
    got = sparse_attention(q, keys, mask, sink, Dh ** -0.5, torch.float32)
    assert torch.equal(got[0, 0], torch.zeros(H, Dh))
    for b in range(B):
        for t in range(T):
            want = R.sink_attention64(q[b, t], keys[b][mask[b, t]], sink, Dh ** -0.5)
            assert (got[b, t].double() - want).abs().max() < 1e-5
    no_sink = sparse_attention(q, keys, mask, torch.full((H,), -torch.inf), Dh ** -0.5, torch.float32)
    assert _rel(no_sink[0, 1:], got[0, 1:]) > 1e-3  # the sink visibly shrinks the output


def test_grouped_low_rank_output(tiny):
    attn = tiny.layers[2].attn
    o = torch.randn(2, 7, attn.n_heads, attn.head_dim)
    pos = torch.randint(0, 500, (7,))
    want = R.grouped_output64(attn, R.rope64(o, pos[:, None], R.freqs64(tiny.cfg, 128), inverse=True))
    assert _rel(attn.output(o, pos), want) < 1e-5


# ------------------------------------------------------------------ MoE
def test_hash_routing_uses_tid2eid(tiny):
    gate = copy.deepcopy(tiny.layers[0].ffn.gate)
    assert gate.hash
    gate.tid2eid.copy_(torch.rand(1024, 8).argsort(-1)[:, :2])  # a fresh table
    x, ids = torch.randn(64, D), torch.randint(0, 1024, (64,))
    w, idx = gate(x, ids)
    assert torch.equal(idx, gate.tid2eid[ids])
    w64, idx64 = R.route64(gate, x, ids)
    assert torch.equal(idx, idx64) and _rel(w, w64) < 1e-6
    scores = x.double() @ gate.weight.double().t()
    assert (idx.sort(-1).values != scores.topk(2).indices.sort(-1).values).any()  # scores did not choose


def test_learned_routing_bias_only_chooses(tiny):
    gate = copy.deepcopy(tiny.layers[2].ffn.gate)
    assert not gate.hash
    gate.bias.copy_(torch.randn(8) * 0.5)
    x, ids = torch.randn(128, D), torch.randint(0, 1024, (128,))
    w, idx = gate(x, ids)
    w64, idx64 = R.route64(gate, x, ids)
    assert torch.equal(idx.sort(-1).values, idx64.sort(-1).values)
    assert _rel(w, w64) < 1e-6 and torch.allclose(w.sum(-1), torch.full((128,), gate.route_scale))
    s = torch.sqrt(torch.nn.functional.softplus(x.double() @ gate.weight.double().t()))
    assert (idx.sort(-1).values != s.topk(2).indices.sort(-1).values).any()  # the bias changed choices
    with_bias = (s + gate.bias.double()).gather(-1, idx)
    assert _rel(w, with_bias / with_bias.sum(-1, keepdim=True) * gate.route_scale) > 1e-3


def test_swiglu_clamp(tiny):
    exp = tiny.layers[2].ffn.experts[int(torch.randint(0, 8, (1,)))]
    x = torch.randn(32, D) * 40  # large enough that the clamp bites
    weight = torch.rand(32) + 0.1
    u = x.double() @ R.weight64(exp.w3).t()
    g = x.double() @ R.weight64(exp.w1).t()
    assert (u.abs() > 10).any() and (g > 10).any()
    assert _rel(exp(x, weight), R.expert64(exp, x, weight, 10.0)) < 1e-5


def test_moe_forward(tiny):
    for layer in (0, 3):  # hash, learned
        moe = tiny.layers[layer].ffn
        x, ids = torch.randn(2, 24, D), torch.randint(0, 1024, (2, 24))
        want = R.moe64(moe, x.view(-1, D), ids.flatten(), 10.0).view(2, 24, D)
        assert _rel(moe(x, ids), want) < 1e-5, f"layer {layer}, seed {tiny.seed}"


@pytest.fixture(scope="module")
def tiny_bf16():
    return dsv4.load("tiny", dtype="bfloat16", seed=_seed())


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_linear_fp8_activation_quant(dtype, tiny, tiny_bf16):
    """bf16: the input is rounded to e4m3 per 128-block before the matmul; float32: not at all."""
    lin = (tiny_bf16 if dtype == "bfloat16" else tiny).layers[1].attn.wq_a
    x = torch.randn(8, D) * torch.rand(8, 1) * 10
    W = R.weight64(lin)
    got = lin(x, out_dtype=torch.float32)
    exact = x.to(lin.act_dtype).double() @ W.t()
    rounded = R.fp8_round64(x.to(lin.act_dtype), 128) @ W.t()
    want, other = (rounded, exact) if dtype == "bfloat16" else (exact, rounded)
    assert _rel(got, want) < 1e-5
    assert _rel(got, other) > 1e-3
