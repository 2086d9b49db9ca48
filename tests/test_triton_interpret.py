"""The Triton kernels (bf16 GEMV, Sinkhorn) on the CPU through Triton's interpreter, against float64.

Skipped where Triton is not installed (the CPU torch wheels don't bring it). Each case runs in a
child process because TRITON_INTERPRET is read when a kernel is defined. The GPU runs of the same
kernels are in tests/test_fuse_gpu.py and tests/test_bf16_gemv_gpu.py.

The interpreter does not support `tl.dot` on bfloat16 (it multiplies the uint16 bit patterns:
triton-lang/triton#11584), so each child first replaces its bf16 dot with a model of a tensor core:
exact products, and an fp32 accumulator that each 16-wide K chunk is added into with truncation
(round toward zero), the pessimistic reading of Fasi et al. 2021. The kernel code is unchanged.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton not installed (its interpreter runs the kernels)")


_BF16_DOT = '''
import numpy as np
import triton.language as tl
from triton.runtime import interpreter as _I
_dot, bf16_dots = _I.InterpreterBuilder.create_dot, [0]
fp8_dots = [0]
import torch as _torch
_E4M3 = _torch.arange(256, dtype=_torch.uint8).view(_torch.float8_e4m3fn).double().numpy()  # e4m3 bits -> values
def _create_dot(self, a, b, d, *args, **kwargs):
    if a.dtype == tl.float8e4nv and b.dtype == tl.float8e4nv:  # e4m3 x e4m3 (Hopper: K = 32 per instruction)
        fp8_dots[0] += 1
        A, B = (_E4M3[np.ascontiguousarray(t.data).view(np.uint8)] for t in (a, b))
        chunk = 32
    elif a.dtype == tl.bfloat16 and b.dtype == tl.bfloat16:
        bf16_dots[0] += 1
        bits = [np.ascontiguousarray(t.data).view(np.uint16).astype(np.uint32) << 16 for t in (a, b)]
        A, B = (v.view(np.float32).astype(np.float64) for v in bits)  # bf16 values, exactly
        chunk = 16
    else:
        return _dot(self, a, b, d, *args, **kwargs)
    acc = d.data.astype(np.float32)
    for k in range(0, A.shape[-1], chunk):
        exact = acc.astype(np.float64) + A[..., k:k + chunk] @ B[..., k:k + chunk, :]
        acc = exact.astype(np.float32)
        up = np.abs(acc) > np.abs(exact)  # rounded away from zero: step back (truncate)
        acc[up] = np.nextafter(acc[up], np.float32(0))
    return _I.TensorHandle(acc, d.dtype.scalar)
_I.InterpreterBuilder.create_dot = _create_dot
_cast = _I.InterpreterBuilder.cast_impl
def _cast_rne(self, src, dst_type):  # fp32 -> bf16 as the GPU converts (nearest even); the interpreter truncates
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        t = _torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).to(_torch.bfloat16)
        return _I.TensorHandle(t.view(_torch.int16).numpy().view(np.uint16), dst_type.scalar)
    return _cast(self, src, dst_type)
_I.InterpreterBuilder.cast_impl = _cast_rne
'''


_CLOSE_ENTRIES = '''
def close_entries(a, b, rounding, where):
    """Cache rows a (the twin's) and b (the kernel's) equal up to rare one-step moves of the rounding: the
    fp32 sum orders (the norm's mean, the pooling) can put a value across a rounding boundary now and
    then: one e4m3 step (2^-3), or after the Hadamard one e2m1 step of the block's grid (2 scales), or
    without rounding two bf16 steps; fp32 rows within 4e-6 of each row's largest."""
    from dsv4.ops.quantize import ue8m0_scale
    af, bf = a.float(), b.float()
    if a.dtype == torch.float32:
        err = ((af - bf).abs().amax(-1) / af.abs().amax(-1).clamp(min=1e-30)).max().item()
        assert err <= 4e-6, (where, err)
        return
    if rounding == "index":
        blocks = af.unflatten(-1, (-1, 32))
        tol = (2 * ue8m0_scale(blocks.abs().amax(-1, keepdim=True), 6.0, 1e-10)).expand_as(blocks).flatten(-2)
    else:
        tol = af.abs() * (2 ** -3 if rounding == "kv" else 2 ** -6)
    assert ((af - bf).abs() <= tol).all(), (where, (af - bf).abs().max())
    assert (a != b).float().mean().item() <= 0.02, (where, (a != b).float().mean())
'''


def _interpret(body: str) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    code = (f"import torch\ng = torch.Generator().manual_seed({seed})\n" + _BF16_DOT + _CLOSE_ENTRIES + textwrap.dedent(body)
            + "\nprint('ok')\n")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), f"seed {seed}\n{r.stderr[-3000:]}"


def test_sinkhorn_kernel_matches_float64_for_any_hc():
    _interpret("""
        from dsv4.kernels import _triton_sinkhorn as K
        from dsv4.ops.sinkhorn import sinkhorn_ref
        for T in (1, 5, 33, 70):
            for hc in (4, 3, 2, 8):
                for iters in (1, 2, 20):
                    x = torch.randn(T, hc, hc, generator=g) * 3
                    y = K.sinkhorn(x, iters, 1e-6)
                    r = sinkhorn_ref(x.double(), iters, 1e-6)
                    err = ((y.double() - r).abs().max() / r.abs().max()).item()
                    assert err < 1e-6, (T, hc, iters, err)
                    assert torch.equal(y, K.sinkhorn(x, iters, 1e-6))
    """)


def test_bf16_gemv_matches_float64_with_and_without_split_k():
    _interpret("""
        from dsv4.kernels import _triton_gemv as K
        seen = set()
        for M, N, K_ in ((1, 512, 4096), (1, 1000, 1000), (2, 64, 4096), (2, 300, 200), (1, 256, 2048),
                         (2, 7, 4000)):
            assert not K.tiles(M, N, K_)[4]  # below the tensor-core threshold
            x = torch.randn(M, K_, generator=g)
            w = torch.randn(N, K_, generator=g).bfloat16()
            y = K.bf16_gemv(x, w)
            ref = x.double() @ w.double().t()
            scale = (x.double().abs() @ w.double().abs().t()).max()
            assert ((y.double() - ref).abs().max() / scale).item() < 1e-6, (M, N, K_)
            assert torch.equal(y, K.bf16_gemv(x, w))
            out = torch.full((M, N), float("nan"))
            assert K.bf16_gemv(x, w, out=out) is out and torch.equal(out, y)
            seen.add(K.tiles(M, N, K_)[3] > 1)
        assert seen == {True, False}  # both the split-K and the single-pass paths ran
    """)


def test_bf16_gemv_tensor_core_path_matches_float64():
    """M from the threshold past the decode cap (80: two row tiles), and M = 1-2 at head-like widths
    (N >= TC_WIDE_N), N not a multiple of the tile, split-K and one pass; rows scaled by 2^-20..2^20 so each row's error is judged against its own max |y|. The
    last case runs one pass over K = 4096 (the LM head's chain length; split-K would cut it short):
    summing all of K in one tensor-core accumulator gives ~2e-5 there under the truncating model, the
    kernel ~4e-7."""
    _interpret("""
        from dsv4.kernels import _triton_gemv as K
        seen = set()
        for M, N, K_ in ((3, 300, 256), (5, 100, 1024), (16, 300, 512), (17, 100, 768), (40, 300, 1000),
                         (64, 100, 1024), (80, 100, 256), (16, 8512, 256), (16, 300, 4096), (1, 8512, 256),
                         (2, 8200, 512)):
            if K_ == 4096:
                K.TARGET_PROGRAMS = 1  # no split: one chain over all of K
            x = torch.randn(M, K_, generator=g) * torch.exp2(torch.randint(-20, 21, (M, 1), generator=g).float())
            w = torch.randn(N, K_, generator=g).bfloat16()
            assert (M >= K.TC_MIN_M or N >= K.TC_WIDE_N) and K.tiles(M, N, K_)[4]
            y = K.bf16_gemv(x, w)
            ref = x.double() @ w.double().t()
            err = ((y.double() - ref).abs().amax(1) / ref.abs().amax(1)).max().item()
            assert err < 2e-6, (M, N, K_, err)
            assert torch.equal(y, K.bf16_gemv(x, w))
            out = torch.full((M, N), float("nan"))
            assert K.bf16_gemv(x, w, out=out) is out and torch.equal(out, y)
            seen.add(K.tiles(M, N, K_)[3] > 1)
        assert seen == {True, False}  # both the split-K and the single-pass paths ran
        assert bf16_dots[0] > 0  # the tensor-core model ran
    """)


def test_bf16_gemv_paths_agree_at_the_threshold():
    _interpret("""
        from dsv4.kernels import _triton_gemv as K
        M = K.TC_MIN_M
        for N, K_ in ((300, 1024), (100, 4096)):
            x = torch.randn(M, K_, generator=g)
            w = torch.randn(N, K_, generator=g).bfloat16()
            ref = x.double() @ w.double().t()
            assert K.tiles(M, N, K_)[4]
            y_tc = K.bf16_gemv(x, w)
            K.TC_MIN_M = M + 1  # the CUDA-core path for the same M
            assert not K.tiles(M, N, K_)[4]
            y_cc = K.bf16_gemv(x, w)
            K.TC_MIN_M = M
            scale = ref.abs().max()
            for y in (y_tc, y_cc):
                assert ((y.double() - ref).abs().max() / scale).item() < 2e-6, (N, K_)
            assert ((y_tc.double() - y_cc.double()).abs().max() / scale).item() < 2e-6, (N, K_)
    """)


def test_mix_sums_kernel_matches_float64():
    """The mHC mixes kernel: x @ fn^T and sum(x^2) (column J) for bf16 and fp32 streams, against
    float64; T past one row block, K split (and not a multiple of the tile), deterministic, the
    split counters back at zero."""
    _interpret("""
        from dsv4.kernels import _triton_mixes as K, _triton_splitk as S
        seen = set()
        for T, J, Kd in ((1, 24, 16384), (3, 24, 4096), (6, 24, 1000), (16, 7, 2048), (2, 24, 64)):
            for dtype in (torch.bfloat16, torch.float32):
                x = (torch.randn(T, Kd, generator=g) * 3).to(dtype)
                fn = torch.randn(J, Kd, generator=g) * 0.01
                y = K.mix_sums(x, fn)
                assert y.shape == (T, J + 1) and y.dtype == torch.float32
                ref = torch.cat((x.double() @ fn.double().t(), x.double().square().sum(-1, keepdim=True)), -1)
                scale = x.double().abs().amax(1, keepdim=True) * fn.double().abs().amax() * Kd ** 0.5
                err = ((y.double() - ref)[:, :J].abs() / scale).max().item()
                assert err < 1e-6, (T, J, Kd, dtype, err)
                assert ((y[:, J].double() - ref[:, J]).abs() / ref[:, J]).max().item() < 1e-6
                assert torch.equal(y, K.mix_sums(x, fn))
                seen.add(K.tiles(T, J, Kd)[3] > 1)
        assert seen == {True, False}
        assert all(int(c.abs().sum()) == 0 for c in S._COUNTERS.values())
    """)


def test_sparse_attention_kernel_matches_the_reference():
    """The decode attention kernels against float64 with the reference's bf16 probability rounding
    (heads not a multiple of the tile, keys not a multiple of the key tile, one or several key tiles per
    split, random masks, one fully masked row whose output is 0, the sink in the denominator); masked
    keys have no influence at all."""
    _interpret("""
        from dsv4.kernels import _triton_attention as A
        for (B, H, N, D), sms in zip(((2, 16, 70, 64), (1, 20, 33, 128), (3, 4, 32, 32), (2, 16, 200, 32)),
                                     (132, 132, 1, 5)):
            A._sms = lambda t, n=sms: n  # one tile per split, or several (few SMs)
            q = (torch.randn(B, H, D, generator=g)).bfloat16()
            keys = (torch.randn(B, N, D, generator=g)).bfloat16()
            mask = torch.rand(B, N, generator=g) < 0.7
            mask[-1] = False if B > 1 else mask[-1]
            sink = torch.randn(H, generator=g)
            scale = D ** -0.5
            o = A.sparse_attention(q, keys, mask, sink, scale)
            logits = torch.einsum("bhd,bnd->bhn", q.double(), keys.double()) * scale
            logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
            full = torch.cat((logits, sink.double().view(1, -1, 1).expand(B, H, 1)), -1).softmax(-1)[..., :-1]
            ref = torch.einsum("bhn,bnd->bhd", full.to(torch.bfloat16).double(), keys.double())
            err = ((o.double() - ref).abs().amax(-1) / ref.abs().amax(-1).clamp(min=1e-3)).max().item()
            assert err < 2e-2, (B, H, N, D, err)
            if B > 1:
                assert torch.equal(o[-1], torch.zeros_like(o[-1]))  # only the sink: no key weight
            other = keys.clone()
            other[~mask] = (torch.randn(int((~mask).sum()), D, generator=g) * 100).bfloat16()
            assert torch.equal(o, A.sparse_attention(q, other, mask, sink, scale))
            assert not torch.equal(o, A.sparse_attention(q, keys, mask, sink + 3, scale))
            assert torch.equal(o, A.sparse_attention(q, keys, mask, sink, scale))
            from dsv4.layers.rope import apply_rope
            for rd in (16, D):  # the inverse RoPE in the last launch: the last rd features, or all of them
                ang = torch.rand(rd // 2, generator=g) * 40
                cos, sin = torch.cos(ang), torch.sin(ang)
                want = apply_rope(o, cos, sin, inverse=True)
                got = A.sparse_attention(q, keys, mask, sink, scale, cos, sin)
                assert torch.equal(got, want), (B, H, N, D, rd)
                assert torch.equal(got[..., : D - rd], o[..., : D - rd]) and not torch.equal(got, o)
            # keys read in place: the window's rows, then compressed entries in order or picked by index
            W = N // 3
            comp = torch.randn(B, N + 5, D, generator=g).bfloat16()
            sel = torch.randint(0, N + 5, (B, N - W), generator=g)
            for c, s_, flat in ((comp[:, : N - W], None, torch.cat((keys[:, :W], comp[:, : N - W]), 1)),
                                (comp, sel, torch.cat((keys[:, :W], comp.gather(1, sel[..., None].expand(-1, -1, D))), 1))):
                assert torch.equal(A.sparse_attention(q, keys[:, :W], mask, sink, scale, comp=c, sel=s_),
                                   A.sparse_attention(q, flat, mask, sink, scale))
    """)


def test_compress_step_kernel_is_the_twin():
    """One compressor decode step in one launch: the slot writes and the block shift leave the state
    bitwise equal to the twin's, and the pooled entry agrees to fp32 summation order, over a sequence
    of positions (blocks completing or not), for both ratios, with empty (-inf) rows and hd not a
    power of two; rounding of the fp32 sums checked against float64."""
    _interpret('''
        from dsv4.kernels import _triton_compress as K
        from dsv4.ops.compress import compress_step_ref
        for ratio, overlap, hd, B in ((4, True, 32, 2), (4, True, 100, 1), (128, False, 48, 2), (8, False, 24, 3)):
            C, rows = (2 * hd, 2 * ratio) if overlap else (hd, ratio)
            kv = torch.randn(B, rows, C, generator=g)
            z = torch.randn(B, rows, C, generator=g)
            z[:, : rows // 2] = float("-inf")  # slots not written yet
            for p in range(2 * ratio + 1):
                kvn, zn, pos = torch.randn(B, C, generator=g), torch.randn(B, C, generator=g), torch.tensor(p)
                a = (kv.clone(), z.clone())
                b = (kv.clone(), z.clone())
                ya = compress_step_ref(kvn, zn, *a, pos, ratio, overlap)
                yb = K.compress_step(kvn, zn, *b, pos, ratio, overlap)
                assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), (ratio, p)
                y64 = compress_step_ref(kvn.double(), zn.double(), kv.double(), z.double(), pos, ratio, overlap)
                scale = a[0].abs().max().double()
                assert ((yb.double() - y64).abs().max() / scale).item() < 1e-6, (ratio, p)
                assert ((ya.double() - y64).abs().max() / scale).item() < 1e-6, (ratio, p)
                kv, z = a
    ''')


def test_comb_kernel_from_the_mixes_sums_matches_float64():
    """The mHC comb straight from the mixes kernel's sums in one launch (RMS scale, scale[2], base, the
    Sinkhorn) against its twin run in float64, for hc 4 (flash) and 3, one token and many."""
    _interpret("""
        from dsv4.kernels import _triton_sinkhorn as K
        from dsv4.ops.sinkhorn import comb_from_sums_ref
        for T in (1, 5, 40):
            for hc in (4, 3):
                J, Kf = 2 * hc + hc * hc, 4096
                sums = torch.randn(T, J + 1, generator=g) * 30
                sums[:, J] = torch.rand(T, generator=g) * Kf * 4 + 1
                scale, base = torch.rand(3, generator=g), torch.randn(J, generator=g)
                y = K.comb(sums, scale, base, Kf, 1e-6, hc, 20, 1e-6)
                r = comb_from_sums_ref(sums.double(), scale.double(), base.double(), Kf, 1e-6, hc, 20, 1e-6)
                err = ((y.double() - r).abs().max() / r.abs().max()).item()
                assert err < 1e-6, (T, hc, err)
                assert torch.equal(y, K.comb(sums, scale, base, Kf, 1e-6, hc, 20, 1e-6))
    """)

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
    (the last with a float32 cache, as the float32 mode has)."""
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
                compress_token_ref(kvn, zn, sa.both, pos, a, w, ang.cos(), ang.sin(), ratio, overlap, 1e-6, rounding)
                K.compress_token(kvn, zn, both, pos, b, w, ang.cos(), ang.sin(), ratio, overlap, 1e-6, rounding)
                assert torch.equal(sa.both, both), (ratio, rounding, p)
                assert torch.equal(b, before) == ((p + 1) % ratio != 0), p  # written only when the block completes
                close_entries(a, b, rounding, (ratio, rounding, p))
                b = a.clone()
    ''')
