"""The graph-ready attention with its q/kv finish and window write as one op, and the indexer's queries as one
(dsv4/kernels ops.attention_entry and ops.index_query, their CPU twins here), against the plain path: the same
logits and caches, bit for bit."""

from __future__ import annotations

import torch


def test_decode_through_the_attention_entry_op_is_the_plain_path(rng, monkeypatch):
    """StaticDecoder steps with the attention entry and index query ops (as on CUDA with the kernels on; here the
    dispatchers are told they apply and the ops run their twins) give the plain path's logits and window
    caches bit for bit, across the window's wrap; the entry op runs once per layer and step, the query op
    once per indexer and step."""
    import dsv4
    from dsv4 import kernels
    from dsv4.decode.static import StaticDecoder
    from dsv4.kernels import ops

    seed = int(torch.randint(0, 999, (1,), generator=rng))
    model = dsv4.load("tiny", dtype="bfloat16", seed=seed)
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 5), generator=rng)
    ids = torch.randint(0, model.cfg.vocab_size, (model.cfg.window_size + 3, 2), generator=rng)
    real, runs = {n: getattr(ops, n) for n in ("attention_entry", "index_query")}, {}
    for mode in ("plain", "entry"):
        monkeypatch.setattr(kernels, "attention_entry_applies", lambda x, w, rows, m=mode: m == "entry")
        monkeypatch.setattr(kernels, "index_query_applies", lambda x, rows, m=mode: m == "entry")
        calls = {n: 0 for n in real}
        for n, f in real.items():
            monkeypatch.setattr(ops, n, lambda *a, n=n, f=f, c=calls: c.__setitem__(n, c[n] + 1) or f(*a))
        dec = StaticDecoder(model, batch_size=2)
        dec.prefill(prompt)
        logits = [dec.decode(step).clone() for step in ids]
        runs[mode] = (logits, [L.attn.cache.window.clone() for L in model.layers])
        indexers = sum(L.attn.indexer is not None for L in model.layers)
        assert calls["attention_entry"] == (len(ids) * model.cfg.n_layers if mode == "entry" else 0), (mode, calls)
        assert calls["index_query"] == (len(ids) * indexers if mode == "entry" else 0), (mode, calls)
    for a, b in zip(runs["entry"][0], runs["plain"][0]):
        assert torch.equal(a, b)
    for a, b in zip(runs["entry"][1], runs["plain"][1]):
        assert torch.equal(a, b)


def test_fused_layers_trace_the_attention_entry_op_without_a_break(rng, monkeypatch):
    """bfloat16 with every kernel integration point on (CPU twins inside the compiled layers): dynamo takes the
    attention entry op (it mutates the window cache) without a graph break, and the fused decode follows
    the static path within bf16 drift."""
    import dsv4
    from torch._dynamo.utils import counters

    from dsv4 import kernels
    from dsv4.decode.graph import CUDAGraphDecoder
    from dsv4.decode.static import StaticDecoder

    monkeypatch.setattr(kernels, "_applies", lambda x: True)
    model = dsv4.load("tiny", dtype="bfloat16", n_layers=2, seed=int(torch.randint(0, 999, (1,), generator=rng)))
    prompt = torch.randint(0, 1024, (2, 9), generator=rng)
    ids = torch.randint(0, 1024, (4, 2), generator=rng)

    def steps(dec):
        dec.prefill(prompt)
        return torch.stack([dec.decode(i).float().clone() for i in ids])

    want = steps(StaticDecoder(model, 2))
    model.reset()
    torch._dynamo.reset()
    counters.clear()
    got = steps(CUDAGraphDecoder(model, mode="eager", batch_size=2, fuse=True).static)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert ((got - want).abs().max() / want.abs().max()).item() < 5e-2
