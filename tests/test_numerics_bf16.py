"""bfloat16 mode against the released rounding order, one step at a time: where the model rounds to
bf16 or FP8 and where it does not (dsv4/NUMERICS.md), each against a float64 restatement of both
choices so the test tells them apart. Fresh random inputs and weights every run."""

from __future__ import annotations

import os

import pytest
import ref64 as R
import torch

import dsv4
from dsv4.layers.attention import sparse_attention
from dsv4.layers.rope import apply_rope, rope_angles

D = 256  # tiny hidden size
_rel = R.rel


@pytest.fixture(scope="module")
def tiny_bf16():
    return dsv4.load("tiny", dtype="bfloat16", seed=int.from_bytes(os.urandom(4), "little") % 2**31)


def test_grouped_output_in_bf16_keeps_o_unrounded_for_wo_a(tiny_bf16):
    """The released model runs wo_a as a bf16 einsum on dequantized weights (no FP8 activation rounding,
    unlike wo_b): the grouped output matches that, and visibly not the FP8-rounded variant."""
    from dsv4.ops.quantize import fp8_fake_quant

    attn = tiny_bf16.layers[2].attn
    o = torch.randn(2, 5, attn.n_heads, attn.head_dim).bfloat16()
    pos = torch.randint(0, 500, (5,))
    got = attn.output(o, pos)
    cos, sin = rope_angles(pos, attn.freqs)
    o_r = apply_rope(o, cos.unsqueeze(-2), sin.unsqueeze(-2), inverse=True).flatten(2)
    G, wa = attn.groups, attn.wo_a.dequantized(torch.float32)
    width, rank = o_r.shape[-1] // G, wa.shape[0] // G

    def through(x):
        parts = [x[..., g * width:(g + 1) * width].float() @ wa[g * rank:(g + 1) * rank].t() for g in range(G)]
        return attn.wo_b(torch.cat(parts, -1).bfloat16(), out_dtype=torch.float32).bfloat16()

    want, rounded = through(o_r), through(fp8_fake_quant(o_r, 128))
    assert _rel(got, want) < 0.25 * _rel(got, rounded), (_rel(got, want), _rel(got, rounded))


def test_per_head_q_normalization_rounds_as_released(tiny_bf16):
    """q *= rsqrt(mean(q^2) + eps) computed in bf16 (the released order), not fp32 then cast."""
    attn = tiny_bf16.layers[1].attn
    x = torch.randn(1, 6, tiny_bf16.cfg.dim).bfloat16()
    q, _, qr = attn.project(x, torch.arange(6))
    raw = attn.wq_b(qr).unflatten(-1, (attn.n_heads, attn.head_dim))
    want = raw * torch.rsqrt(raw.square().mean(-1, keepdim=True) + tiny_bf16.cfg.norm_eps)
    cos, sin = rope_angles(torch.arange(6), attn.freqs)
    assert torch.equal(q, apply_rope(want, cos.unsqueeze(-2), sin.unsqueeze(-2)))


def test_sparse_attention_bf16_probabilities():
    """bf16 mode casts the probabilities to bf16 before P @ V (fp32 q and keys isolate that step)."""
    q, keys = torch.randn(1, 6, 4, 64), torch.randn(1, 40, 64)
    sink, scale = torch.randn(4), 64 ** -0.5
    got = sparse_attention(q, keys, None, sink, scale, torch.bfloat16)
    logits = torch.einsum("bthd,bnd->bthn", q.double(), keys.double()) * scale
    e = torch.exp(logits)
    p = e / (e.sum(-1, keepdim=True) + torch.exp(sink.double())[:, None])
    # the same probabilities in fp32 (the model's precision): rounding them to bf16 from float64
    # instead would flip a bf16 rounding now and then (p within 1e-7 of a rounding boundary)
    l32 = torch.einsum("bthd,bnd->bthn", q, keys) * scale
    p32 = torch.cat((l32, sink.float().view(1, 1, -1, 1).expand(1, 6, 4, 1)), -1).softmax(-1)[..., :-1]
    assert _rel(p32, p) < 1e-6
    rounded = torch.einsum("bthn,bnd->bthd", p32.to(torch.bfloat16).double(), keys.double())
    exact = torch.einsum("bthn,bnd->bthd", p, keys.double())
    assert _rel(got, rounded) < 1e-5 and _rel(got, exact) > 1e-4


def test_expert_weight_applied_before_w2_in_bf16(tiny_bf16):
    """In bf16 the activation is cast and FP8-rounded before w2, so weighting before or after w2
    differs; the module must match 'before' (the released order)."""
    exp = tiny_bf16.layers[2].ffn.experts[int(torch.randint(0, 8, (1,)))]
    x = (torch.randn(16, D) * 4).bfloat16()
    w = torch.rand(16) + 0.2
    xq = R.fp8_round64(x, 128)
    g, u = xq @ R.weight64(exp.w1).t(), xq @ R.weight64(exp.w3).t()
    u, g = u.clamp(-10, 10), g.clamp(max=10)
    a = g * torch.sigmoid(g) * u
    before = R.fp8_round64((a * w.double()[:, None]).bfloat16(), 128) @ R.weight64(exp.w2).t()
    after = (R.fp8_round64(a.bfloat16(), 128) @ R.weight64(exp.w2).t()) * w.double()[:, None]
    got = exp(x, w)
    # per row, the median: a row whose 128-block amax sits on an FP8 rounding boundary rounds its whole block
    # the other way in the module's fp32 than in this float64 reference (seen once in CI: one row of 16 off by
    # 6e-3); the order of weighting and rounding shows in every row
    def rows(a, b):
        return float(((a.double() - b).norm(dim=-1) / b.norm(dim=-1)).median())
    assert rows(got, before) < 2e-3
    assert rows(got, after) > 3 * rows(got, before)
