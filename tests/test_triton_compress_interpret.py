"""The compressor's Triton kernels (entry, whole step) on the CPU through Triton's interpreter,
against their pure-torch twins (dsv4/ops/compress.py). Harness: tests/test_triton_interpret.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from test_triton_interpret import _interpret as _run

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton not installed (its interpreter runs the kernels)")


# the child process imports the tolerance from tests/entry_util.py, shared with the GPU tests
_PRELUDE = f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\nfrom entry_util import close_entries\n"


def _interpret(body: str) -> None:
    _run(body, _PRELUDE)


def test_compress_entry_kernel_is_the_twin():
    """A compressor entry's finish and cache write in one launch: over positions that do and do not
    complete a block, the cache equals the twin's (model dtype, RMSNorm, RoPE at the block's position, the
    KV rounding per 64 before the RoPE features, or the indexer's Hadamard rotation then FP4 per 32), with
    the old row kept where the block is incomplete; bf16 with and without the roundings, fp32 without, hd
    not a power of two."""
    _interpret('''
        from dsv4.kernels import _triton_entry as K
        from dsv4.ops.compress import compress_entry_ref
        for hd, rd, dt, kv, B in ((128, 64, torch.bfloat16, "kv", 2), (96, 32, torch.bfloat16, "kv", 1),
                                  (128, 64, torch.bfloat16, "none", 2), (96, 32, torch.float32, "none", 2),
                                  (128, 64, torch.bfloat16, "index", 2), (64, 32, torch.bfloat16, "index", 1)):
            w = (1 + 0.3 * torch.randn(hd, generator=g)).bfloat16()
            out = torch.randn(B, 6, hd, generator=g).to(dt)
            for p in (3, 4, 7, 9, 15):
                pooled = torch.randn(B, hd, generator=g) * torch.exp2(torch.randint(-8, 8, (B, 1), generator=g).float())
                ang = torch.rand(rd // 2, generator=g) * 30
                a, b = out.clone(), out.clone()
                pos = torch.tensor(p)
                compress_entry_ref(pooled, w, ang.cos(), ang.sin(), pos, a, 4, 1e-6, kv)
                K.compress_entry(pooled, w, ang.cos(), ang.sin(), pos, b, 4, 1e-6, kv)
                close_entries(a, b, kv, (hd, rd, kv, p))
                assert torch.equal(b, out) == ((p + 1) % 4 != 0), p  # written only when the block completes
                out = a
    ''')


def test_entry_hadamard_and_e2m1_helpers_are_the_reference_bit_for_bit():
    """The entry kernel's index rounding pieces on their own: the butterflies times hd^-1/2 equal
    quantize.hadamard, and the e2m1 rounding equals fp4_fake_quant, bit for bit, on values that include
    exact ties between two e2m1 neighbours (ties go to the even code), zeros, negatives and all-tiny blocks."""
    _interpret('''
        import importlib.util, pathlib, tempfile
        from dsv4.ops.quantize import fp4_fake_quant, hadamard
        src = (
            "import triton\\nimport triton.language as tl\\n"
            "from dsv4.kernels._triton_entry import _hadamard, _round_e2m1\\n"
            "@triton.jit\\n"
            "def probe(x_ptr, h_ptr, q_ptr, BLOCK: tl.constexpr, LOG: tl.constexpr, S: tl.constexpr):\\n"
            "    c = tl.arange(0, BLOCK)\\n"
            "    x = tl.load(x_ptr + c)\\n"
            "    tl.store(h_ptr + c, _hadamard(x, BLOCK, LOG) * S)\\n"
            "    tl.store(q_ptr + c, _round_e2m1(x, BLOCK, 32))\\n")
        path = pathlib.Path(tempfile.mkdtemp()) / "entry_probe.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location("entry_probe", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
        for n in (32, 64, 128, 256):
            for trial in range(6):
                scale = torch.exp2(torch.randint(-12, 12, (n // 32, 1), generator=g).float())
                ties = (grid[:-1] + grid[1:]) / 2  # midpoints between neighbours, in units of the block scale
                pick = torch.randint(0, 7, (n // 32, 32), generator=g)
                x = torch.where(torch.rand(n // 32, 32, generator=g) < 0.5, ties[pick],
                                torch.randn(n // 32, 32, generator=g) * 2)
                x[:, 0] = 6.0  # the block's amax sets the scale to exactly this grid (amax / 6 = 1)
                x = (x * torch.where(torch.rand(n // 32, 32, generator=g) < 0.5, -1.0, 1.0) * scale).flatten()
                if trial == 0:
                    x[:32] = 1e-9 * torch.randn(32, generator=g)  # near the scale floor (1e-10)
                x = x.bfloat16().float()
                h, q = torch.empty_like(x), torch.empty_like(x)
                mod.probe[(1,)](x, h, q, BLOCK=n, LOG=n.bit_length() - 1, S=n ** -0.5)
                assert torch.equal(h, hadamard(x)), n
                want = fp4_fake_quant(x, 32)
                assert torch.equal(q, want) and torch.equal(q.signbit(), want.signbit()), (n, (q != want).sum())
    ''')


def test_compress_token_kernel_is_the_twin_over_blocks():
    """A compressor's whole step in one launch, step after step over three blocks: the state buffer (the
    token's slot, the overlapping block's shift) bit for bit the twin's, and the cache written only at each
    block's end, equal to the twin's up to rare one-step rounding moves (the pooling's and the norm's fp32
    sum orders); overlapping ratio 4 with the KV and the index roundings, non-overlapping ratios 16 and 8
    (the last with a float32 cache, as the float32 mode has); the gate logits given raw with the ape rows
    to add (all but the last case)."""
    _interpret('''
        from dsv4.cache import CompressorState
        from dsv4.kernels import _triton_token as K
        from dsv4.ops.compress import compress_token_ref
        for ratio, overlap, hd, rd, rounding, B, dt in ((4, True, 128, 64, "kv", 2, torch.bfloat16),
                                                        (4, True, 64, 32, "index", 1, torch.bfloat16),
                                                        (16, False, 128, 64, "kv", 2, torch.bfloat16),
                                                        (8, False, 96, 32, "none", 1, torch.float32)):
            C = 2 * hd if overlap else hd
            sa = CompressorState.allocate(B, 4 if overlap else ratio, hd, "cpu")
            both = sa.both.clone()
            w = (1 + 0.3 * torch.randn(hd, generator=g)).bfloat16()
            a = torch.randn(B, 4, hd, generator=g).to(dt)
            b = a.clone()
            for p in range(3 * ratio):
                kvn = torch.randn(B, C, generator=g) * 2
                zn = torch.randn(B, C, generator=g) * 3
                ang = torch.rand(rd // 2, generator=g) * 30
                pos, before = torch.tensor(p), b.clone()
                ape = None if rounding == "none" else torch.randn(ratio, C, generator=g)  # the projection's raw z
                compress_token_ref(kvn, zn, sa.both, pos, a, w, ang.cos(), ang.sin(), ratio, overlap, 1e-6, rounding, ape)
                K.compress_token(kvn, zn, both, pos, b, w, ang.cos(), ang.sin(), ratio, overlap, 1e-6, rounding, ape)
                assert torch.equal(sa.both, both), (ratio, rounding, p)
                if ape is not None:  # the slot holds the logits with the ape row of the token's place
                    slot = p % ratio + (ratio if overlap else 0)
                    assert torch.equal(both[:, slot, 1], zn + ape[p % ratio]) or (overlap and (p + 1) % ratio == 0)
                assert torch.equal(b, before) == ((p + 1) % ratio != 0), p  # written only when the block completes
                close_entries(a, b, rounding, (ratio, rounding, p))
                b = a.clone()
    ''')
