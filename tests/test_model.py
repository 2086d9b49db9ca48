"""The whole tiny DeepSeek-V4: prefill/decode parity, batching, a float64 restatement of the full
forward pass, bfloat16 numerics (the simulated quantization really happens, and only there), and
the user errors of the model API.

Token ids and weight seeds are fresh random draws every run (os.urandom), so the parity checks
cannot pass by luck on one fixed prompt; a failure message carries the seed to reproduce it.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import ref64 as R
import torch

import dsv4
from dsv4.ops import kvquant, quantize

VOCAB = 1024






def _gen() -> tuple[torch.Generator, int]:
    seed = int.from_bytes(os.urandom(4), "little") % 2**31
    return torch.Generator().manual_seed(seed), seed


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def _rows_rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.double(), b.double()
    return (a - b).norm(dim=-1) / b.norm(dim=-1)


# ------------------------------------------------------------------ prefill vs decode
@contextlib.contextmanager
def _choice_gaps(gaps: list):
    """Records, for every top-k the model takes (the indexer's blocks, the routed experts), the smallest
    relative gap between the k-th and the (k+1)-th value. Prefill and decode sum in different orders
    (a few 1e-7 apart in float32), so where a gap is that small they may choose differently, legitimately
    (seed 1559410184: a gap of 4.6e-7, logits 5e-4 apart after 300 tokens)."""
    orig = torch.Tensor.topk

    def topk(self, k, dim=-1, *args, **kwargs):
        if self.shape[dim] > k:
            v = orig(self.detach(), k + 1, dim).values
            hi, lo = v.select(dim, k - 1), v.select(dim, k)
            ok = torch.isfinite(hi) & torch.isfinite(lo)
            if ok.any():
                gaps.append(((hi - lo)[ok] / hi[ok].abs().clamp(min=1e-6)).min().item())
        return orig(self, k, dim, *args, **kwargs)

    torch.Tensor.topk = topk
    try:
        yield
    finally:
        torch.Tensor.topk = orig


def _decode_run(split: int):
    """A fresh random model and 300 tokens, prefilled whole and prefilled to `split` then decoded; None when a
    top-k choice on the way was within float32 noise of its boundary (draw again)."""
    g, seed = _gen()
    gaps: list[float] = []
    with _choice_gaps(gaps):
        model = dsv4.load("tiny", dtype="float32", seed=seed)
        ids = torch.randint(0, VOCAB, (1, 300), generator=g)
        full = model.prefill(ids)
        step = {split - 1: model.prefill(ids[:, :split])}  # logits after position p, predicting p+1
        for p in range(split, 300):
            step[p] = model.decode(ids[:, p])
    return None if min(gaps, default=1.0) < 2e-6 else (g, seed, model, ids, full, step)


@pytest.mark.parametrize("split", [1, 200])
def test_prefill_equals_prefill_then_decode(split):
    """300 tokens: the window (16) wraps many times, ratio-4 and ratio-128 blocks are emitted both
    inside the prefill and during decode, and the indexer's top-k (8) is saturated."""
    run = next((r for r in (_decode_run(split) for _ in range(8)) if r is not None), None)
    assert run is not None, "8 draws in a row with a top-k choice within float32 noise of its boundary"
    g, seed, model, ids, full, step = run
    assert _rel(step[299], full) <= 1e-5, f"seed {seed}"
    # each decode step against a prefill that ends at the same position: block-completion steps
    # (ratio 4: p = 4j+3, ratio 128: p = 127, 255), window wrap (p = 16), and random ones
    picks = {p for p in (3, 4, 15, 16, 127, 128, 255, 256) if p >= split}
    picks |= set(torch.randint(split, 299, (3,), generator=g).tolist())
    for p in sorted(picks):
        ref = model.prefill(ids[:, :p + 1])
        assert _rel(step[p], ref) <= 1e-5, f"position {p}, seed {seed}"


def test_batch_of_two_equals_two_single_runs():
    g, seed = _gen()
    model = dsv4.load("tiny", dtype="float32", seed=seed)
    T = int(torch.randint(122, 128, (1,), generator=g))  # 6 decode steps cross p = 127 (ratio-128 block)
    ids = torch.randint(0, VOCAB, (2, T + 6), generator=g)
    batched = [model.prefill(ids[:, :T])] + [model.decode(ids[:, p]) for p in range(T, T + 6)]
    for b in range(2):
        single = [model.prefill(ids[b:b + 1, :T])] + [model.decode(ids[b:b + 1, p]) for p in range(T, T + 6)]
        for k, (x, y) in enumerate(zip(batched, single)):
            assert _rel(x[b], y[0]) <= 1e-5, f"row {b}, step {k}, seed {seed}"


# ------------------------------------------------------------------ float64 restatement
def test_full_forward_matches_float64_restatement():
    """Every layer kind (ratio 0/4/128, hash and learned MoE) through tests/ref64.py, written from
    docs/model.md. T > 128 so a ratio-128 block is visible and the indexer must choose."""
    g, seed = _gen()
    model = dsv4.load("tiny", dtype="float32", seed=seed)
    T = int(torch.randint(130, 160, (1,), generator=g))
    ids = torch.randint(0, VOCAB, (T,), generator=g)
    got = model.prefill(ids[None])[0]
    want = R.model_logits64(model, ids)
    assert _rel(got, want) <= 1e-5, f"seed {seed}"


# ------------------------------------------------------------------ bfloat16 mode
def test_bfloat16_runs_finite_and_near_float32():
    """bf16 follows the released numerics (FP8 activations, FP8/FP4 KV rounding), so it differs from
    the exact float32 reference; random weights also flip some expert choices. Typical relative
    logit error is ~5% (worst rows ~25%); the bound is loose (median 15%, worst row 60%), but an
    unrelated or broken model (relative error ~1.4) fails it."""
    g, seed = _gen()
    f32 = dsv4.load("tiny", dtype="float32", seed=seed)
    bf16 = dsv4.load("tiny", dtype="bfloat16", seed=seed)
    T = int(torch.randint(100, 260, (1,), generator=g))
    ids = torch.randint(0, VOCAB, (4, T + 3), generator=g)
    errs = []
    for model_out in zip([f32.prefill(ids[:, :T])] + [f32.decode(ids[:, p]) for p in range(T, T + 3)],
                         [bf16.prefill(ids[:, :T])] + [bf16.decode(ids[:, p]) for p in range(T, T + 3)]):
        ref, got = model_out
        assert got.dtype == torch.float32 and torch.isfinite(got).all(), f"seed {seed}"
        errs.append(_rows_rel(got, ref))
    errs = torch.cat(errs)
    assert errs.median() < 0.15 and errs.max() < 0.6, f"seed {seed}: {errs}"


def _count_fake_quant(monkeypatch) -> dict:
    """Counts fp8 fake-quant calls by block size (128 = activations, 64 = KV) and fp4 calls."""
    calls: dict = {}

    def wrap(fn, tag):
        def counted(x, block=None, *a, **kw):
            calls[(tag, block)] = calls.get((tag, block), 0) + 1
            return fn(x, block, *a, **kw) if block is not None else fn(x, *a, **kw)
        return counted

    monkeypatch.setattr(quantize, "fp8_fake_quant", wrap(quantize.fp8_fake_quant, "fp8"))
    monkeypatch.setattr(kvquant, "fp8_fake_quant", wrap(kvquant.fp8_fake_quant, "fp8"))
    monkeypatch.setattr(kvquant, "fp4_fake_quant", wrap(kvquant.fp4_fake_quant, "fp4"))
    return calls


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_simulated_quantization_only_in_bfloat16(dtype, monkeypatch):
    """bf16: window and compressed KV hold e4m3 x 2^k per 64 on the non-RoPE dims, indexer keys hold
    e2m1 x 2^k per 32, and FP8 activation rounding runs. float32: none of it."""
    g, seed = _gen()
    calls = _count_fake_quant(monkeypatch)
    model = dsv4.load("tiny", dtype=dtype, seed=seed)
    T = int(torch.randint(256, 290, (1,), generator=g))
    ids = torch.randint(0, VOCAB, (2, T + 5), generator=g)
    model.prefill(ids[:, :T])
    for p in range(T, T + 5):  # the last window slots are written by decode
        model.decode(ids[:, p])
    pos, nope = T + 5, model.cfg.nope_head_dim
    checks = []  # (what, representable per block: tensor of bools)
    for i, layer in enumerate(model.layers):
        c, m = layer.attn.cache, layer.attn.ratio
        checks.append((f"layer {i} window", R.representable_fp8_blocks(c.window[..., :nope], 64)))
        if m:
            checks.append((f"layer {i} compressed", R.representable_fp8_blocks(c.comp[:, :pos // m, :nope], 64)))
        if m == 4:
            checks.append((f"layer {i} index keys", R.representable_fp4_blocks(c.index_keys[:, :pos // 4], 32)))
        rope_dims = R.representable_fp8_blocks(c.window[..., nope:], 64)
        assert not rope_dims.all(), f"layer {i}: the RoPE dims must stay unrounded (seed {seed})"
    if dtype == "bfloat16":
        for what, ok in checks:
            assert ok.all(), f"{what}: {int((~ok).sum())} blocks not on the FP grid (seed {seed})"
        assert calls.get(("fp8", 128), 0) > 0 and calls.get(("fp8", 64), 0) > 0 and calls.get(("fp4", 32), 0) > 0
    else:
        for what, ok in checks:
            assert ok.float().mean() < 0.05, f"{what}: float32 mode must not round (seed {seed})"
        assert not calls, calls


# ------------------------------------------------------------------ API errors
def test_api_user_errors_are_dsv4errors():
    model = dsv4.load("tiny", dtype="float32", max_seq_len=40)
    with pytest.raises(dsv4.DSV4Error, match="decode before prefill"):
        model.decode(torch.tensor([1]))
    with pytest.raises(dsv4.DSV4Error, match="longer than the cache"):
        model.prefill(torch.randint(0, VOCAB, (1, 41)))
    with pytest.raises(dsv4.DSV4Error, match="vocabulary"):
        model.prefill(torch.tensor([[1, VOCAB]]))
    with pytest.raises(dsv4.DSV4Error, match="vocabulary"):
        model.prefill(torch.tensor([[-1, 2]]))
    with pytest.raises(dsv4.DSV4Error, match="LongTensor"):
        model.prefill(torch.rand(1, 3))
    model.prefill(torch.randint(0, VOCAB, (2, 38)))
    with pytest.raises(dsv4.DSV4Error, match="batch-size mismatch"):
        model.decode(torch.tensor([1]))
    with pytest.raises(dsv4.DSV4Error, match="batch-size mismatch"):
        model.decode(torch.tensor([1, 2, 3]))
    with pytest.raises(dsv4.DSV4Error, match="vocabulary"):
        model.decode(torch.tensor([1, VOCAB + 5]))
    model.decode(torch.tensor([1, 2]))
    model.decode(torch.tensor([1, 2]))  # position 39: the last one the cache holds
    with pytest.raises(dsv4.DSV4Error, match="max_seq_len"):
        model.decode(torch.tensor([1, 2]))
    model.reset()
    with pytest.raises(dsv4.DSV4Error, match="decode before prefill"):
        model.decode(torch.tensor([1, 2]))
    with pytest.raises(dsv4.DSV4Error, match="unknown preset"):
        dsv4.load("tinyy")
