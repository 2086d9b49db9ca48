"""The compressor's entry twin on the CPU: what the one-launch entry kernel computes (dsv4/kernels/_triton_entry.py),
held bit for bit to the model's own path (Compressor.finish, then the static step's slot write)."""

from __future__ import annotations

import torch


def test_compress_entry_twin_is_the_compressor_finish_and_slot_write(rng):
    """dsv4/ops/compress.compress_entry_ref (what the one-launch entry kernel computes) equals the static
    path's Compressor.finish + write_slot, bit for bit, for the KV compressors and the indexer's (each with
    its own rounding, and with none), at positions that complete a block and ones that do not."""
    import dsv4
    from dsv4.cache import write_slot
    from dsv4.ops.compress import compress_entry_ref

    model = dsv4.load("tiny", dtype="bfloat16", seed=int(torch.randint(0, 999, (1,), generator=rng)))
    comps = [L.attn.compressor for L in model.layers if L.attn.compressor is not None][:2]
    comps += [L.attn.indexer.compressor for L in model.layers if L.attn.indexer is not None][:1]
    assert [c.rounding for c in comps] == ["kv", "kv", "index"]
    for comp in comps:
        own = comp.rounding
        for rounding in (own, "none"):
            comp.rounding = rounding
            out = torch.randn(2, 5, comp.width, generator=rng).bfloat16()
            for p in (comp.ratio - 1, comp.ratio + 1, 3 * comp.ratio - 1):
                pooled, pos = torch.randn(2, comp.width, generator=rng) * 3, torch.tensor(p)
                want = out.clone()
                write_slot(want, (pos // comp.ratio).view(1), comp.finish(pooled[:, None], pos // comp.ratio)[:, 0],
                           keep=((pos + 1) % comp.ratio) != 0)
                cos, sin = rope_angles_at(comp, p)
                got = out.clone()
                compress_entry_ref(pooled, comp.norm.weight, cos, sin, pos, got, comp.ratio, comp.norm.eps, rounding)
                assert torch.equal(got, want), (comp.ratio, rounding, p)
        comp.rounding = own


def rope_angles_at(comp, p: int):
    from dsv4.layers.rope import rope_angles

    return rope_angles(torch.tensor((p // comp.ratio) * comp.ratio), comp.freqs)


def test_compressor_step_through_the_entry_and_whole_step_ops_is_the_plain_path(rng, monkeypatch):
    """static_attention.compressor_step wired through the entry op and the whole-step op (as on CUDA with the
    kernels on: here the dispatchers are told they apply and the ops run their CPU twins) leaves the same
    state and cache as the plain path, bit for bit, step after step over three blocks, for the KV
    compressors and the indexer's; DSV4_TRITON_TOKEN=1 routes every step through the whole-step op."""
    import dsv4
    from dsv4 import kernels
    from dsv4.cache import CompressorState
    from dsv4.decode.static_attention import compressor_step
    from dsv4.kernels import ops

    model = dsv4.load("tiny", dtype="bfloat16", seed=int(torch.randint(0, 999, (1,), generator=rng)))
    comps = [L.attn.compressor for L in model.layers if L.attn.compressor is not None][:2]
    comps += [L.attn.indexer.compressor for L in model.layers if L.attn.indexer is not None][:1]
    d = model.cfg.dim
    real = {name: getattr(ops, f"compress_{name}") for name in ("entry", "token")}
    for comp in comps:
        xs = [torch.randn(2, 1, d, generator=rng).bfloat16() for _ in range(3 * comp.ratio)]
        runs = {}
        for mode in ("plain", "entry", "token"):
            monkeypatch.setattr(kernels, "_applies", (lambda x: False) if mode == "plain" else (lambda x: True))
            monkeypatch.setenv("DSV4_TRITON_ENTRY", "1")
            monkeypatch.setenv("DSV4_TRITON_TOKEN", "1" if mode == "token" else "0")
            calls = {"entry": 0, "token": 0}
            for name, f in real.items():
                monkeypatch.setattr(ops, f"compress_{name}",
                                    lambda *a, n=name, f=f, c=calls: c.__setitem__(n, c[n] + 1) or f(*a))
            state = CompressorState.allocate(2, comp.ratio, comp.width, "cpu")
            out = torch.zeros(2, 4, comp.width, dtype=torch.bfloat16)
            for p, x in enumerate(xs):
                compressor_step(comp, x, torch.tensor(p), state, out)
            runs[mode] = (state.both.clone(), out.clone())
            assert calls["token"] == (len(xs) if mode == "token" else 0), (mode, calls)
            assert calls["entry"] == (len(xs) if mode == "entry" else 0), (mode, calls)
        for mode in ("entry", "token"):
            assert all(torch.equal(a, b) for a, b in zip(runs[mode], runs["plain"])), (comp.rounding, mode)
