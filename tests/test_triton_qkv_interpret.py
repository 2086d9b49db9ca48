"""The attention entry kernel (q and window key finished, key written; dsv4/kernels/_triton_qkv.py) on the
CPU through Triton's interpreter, against its pure-torch twin. Harness: tests/test_triton_interpret.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from test_triton_interpret import _interpret as _run

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton not installed (its interpreter runs the kernels)")

_PRELUDE = f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\nfrom entry_util import close_entries\n"


def test_attention_entry_kernel_is_the_twin():
    """Per-head RMS and RoPE of every query head, the key's norm, RoPE and KV rounding written into window
    slot pos % W and nowhere else: within a rounding step of the twin, over positions that wrap the window,
    heads at scales 2^-8..2^8, with and without the rounding, a head width that is not a power of two, and
    a key that is a strided view (the stacked projection's slice), inputs in bf16 or as the projections' fp32.
    The queries are held to eager bf16 ops as CUDA runs them (each op in fp32, rounded once: `cuda_q`); torch's CPU bf16 rsqrt rounds through a
    bf16 square root instead, so the twin on the CPU is held to 2^-5 of each head's largest value only."""
    _run('''
        from dsv4.kernels import _triton_qkv as K
        from dsv4.layers.rope import apply_rope
        from dsv4.ops.attention import attention_entry_ref

        def cuda_q(q, H, D, cos, sin):
            x = q.view(q.shape[0], H, D).float()
            bf = lambda t: t.bfloat16().float()
            m = bf(bf(x * x).sum(-1, keepdim=True) * (1.0 / D))
            y = bf(x * bf(bf(m + 1e-6).rsqrt())).bfloat16()
            return apply_rope(y, cos, sin).flatten(1)[:, None]
        for B, H, D, rd, rounding, src in ((2, 3, 128, 64, "kv", torch.float32), (1, 4, 96, 32, "kv", torch.bfloat16),
                                           (2, 2, 128, 64, "none", torch.bfloat16)):
            w = (1 + 0.3 * torch.randn(D, generator=g)).bfloat16()
            window = torch.randn(B, 5, D, generator=g).bfloat16()
            for p in (0, 4, 5, 13):
                q = (torch.randn(B, H, D, generator=g) * torch.exp2(torch.randint(-8, 8, (B, H, 1), generator=g).float()))
                q = q.flatten(1).to(src)  # fp32: the projection's output, rounded by the kernel as Linear would
                stacked = (torch.randn(B, 7 + D, generator=g) * 3).to(src)
                kv = stacked[:, 7:]  # a view with row stride 7 + D
                ang = torch.rand(rd // 2, generator=g) * 30
                a, b = window.clone(), window.clone()
                pos = torch.tensor(p)
                qa = attention_entry_ref(q, kv, w, ang.cos(), ang.sin(), pos, a, 1e-6, 1e-6, rounding)
                qb = K.attention_entry(q, kv, w, ang.cos(), ang.sin(), pos, b, 1e-6, 1e-6, rounding)
                assert qb.shape == (B, H, D) and qb.dtype == torch.bfloat16
                close_entries(cuda_q(q.bfloat16(), H, D, ang.cos(), ang.sin()), qb.flatten(1)[:, None], "none", ("q", D, p))
                assert ((qa.float() - qb.float()).abs() <= qa.float().abs().amax(-1, keepdim=True) * 2 ** -5).all()
                slot = p % 5
                close_entries(a[:, slot:slot + 1], b[:, slot:slot + 1], rounding, ("kv", D, rounding, p))
                others = [s for s in range(5) if s != slot]
                assert torch.equal(b[:, others], window[:, others]), p  # only the slot is written
                assert not torch.equal(b[:, slot], window[:, slot]), p
                window = a
    ''', _PRELUDE)


def test_index_query_kernel_is_the_twin():
    """The indexer's decode queries in one launch: the projection's output rounded to bf16, RoPE'd, rotated
    and rounded to e2m1 per 32, within one e2m1 step of the twin's (the same rule as the compressor's index
    entries), heads at scales 2^-8..2^8, fp32 and bf16 inputs, a strided row."""
    _run('''
        from dsv4.kernels import _triton_qkv as K
        from dsv4.ops.attention import index_query_ref
        for B, H, hd, rd, src in ((2, 3, 128, 64, torch.float32), (1, 4, 64, 32, torch.bfloat16)):
            for trial in range(3):
                q = torch.randn(B, H, hd, generator=g) * torch.exp2(torch.randint(-8, 8, (B, H, 1), generator=g).float())
                wide = torch.zeros(B, H * hd + 16, dtype=src)
                wide[:, 16:] = q.flatten(1).to(src)
                q = wide[:, 16:]
                ang = torch.rand(rd // 2, generator=g) * 30
                a = index_query_ref(q, ang.cos(), ang.sin(), hd, torch.bfloat16)
                b = K.index_query(q, ang.cos(), ang.sin(), hd, torch.bfloat16)
                assert b.shape == (B, H, hd) and b.dtype == torch.bfloat16
                close_entries(a, b, "index", (hd, trial))
    ''', _PRELUDE)
