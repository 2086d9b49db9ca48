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
