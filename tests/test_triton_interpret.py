"""The Triton kernels (bf16 GEMV, Sinkhorn) on the CPU through Triton's interpreter, against float64.

Skipped where Triton is not installed (the CPU torch wheels don't bring it). Each case runs in a
child process because TRITON_INTERPRET is read when a kernel is defined: a fork of one warm process per test
process (tests/interpret_server.py), which imported torch and Triton once. The GPU runs of the same
kernels are in tests/test_fuse_gpu.py and tests/test_bf16_gemv_gpu.py.

The interpreter does not support `tl.dot` on bfloat16 (it multiplies the uint16 bit patterns:
triton-lang/triton#11584), so each child first replaces its bf16 dot with a model of a tensor core:
exact products, and an fp32 accumulator that each 16-wide K chunk is added into with truncation
(round toward zero), the pessimistic reading of Fasi et al. 2021. The kernel code is unchanged.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton not installed (its interpreter runs the kernels)")


# Triton <= 3.6's interpreter reads a scalar argument (a 1-element array) with int(array), which NumPy >= 2.4 refuses
# ("only 0-dimensional arrays can be converted to Python scalars"): every `range(..)` over a runtime bound fails.
# Later Triton squeezes the array first; the child does the same on the versions that do not.
INDEX_FIX = '''
import numpy as np
from triton.runtime import interpreter as _I
if hasattr(_I, "_patch_lang_tensor"):
    _patch_tensor0 = _I._patch_lang_tensor
    def _patch_lang_tensor(tensor, scope):
        _patch_tensor0(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).squeeze()))
    _I._patch_lang_tensor = _patch_lang_tensor

# A @triton.jit helper called from a kernel patches triton.language again at every call (inspect.getmembers over
# the language modules: a fifth of a run's time) although the launch around it already did. Inside a launch, a
# helper whose language modules the launch patched skips it; the launch's own restore undoes them all.
import inspect as _inspect
import triton.language as _tl
_patch_lang0, _patched = _I._patch_lang, []
def _langs(fn):
    return frozenset(id(v) for v in list(fn.__globals__.values()) if _inspect.ismodule(v) and v in (_tl, _tl.core))
class _Scope:
    def __init__(self, inner=None):
        self.inner = inner
    def restore(self):
        if self.inner is not None:
            _patched.pop()
            self.inner.restore()
def _patch_lang_once(fn):
    if _patched:  # a helper inside a launch
        return _Scope() if _langs(fn) <= _patched[-1] else _patch_lang0(fn)
    scope = _Scope(_patch_lang0(fn))  # a launch
    _patched.append(_langs(fn))
    return scope
_I._patch_lang = _patch_lang_once
'''

_BF16_DOT = INDEX_FIX + '''
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


def _interpret(body: str, prelude: str = "") -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    code = (f"import torch\ng = torch.Generator().manual_seed({seed})\n" + _BF16_DOT + prelude + textwrap.dedent(body)
            + "\nprint('ok')\n")
    status, out = run_interpreted(code)
    assert status == 0 and out.strip().endswith("ok"), f"seed {seed}\n{out[-3000:]}"


_SERVER: list = []  # this test process's warm interpreter process (tests/interpret_server.py), started on first use


def run_interpreted(code: str, timeout: float = 600) -> tuple[int, str]:
    """(exit status, output) of `code` run with TRITON_INTERPRET=1 in a fork of the warm interpreter process."""
    if not _SERVER or _SERVER[0].poll() is not None:
        env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        _SERVER[:] = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "interpret_server.py")], env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)]
    proc = _SERVER[0]
    fd, out = tempfile.mkstemp(suffix=".log")
    os.close(fd)
    try:
        proc.stdin.write(json.dumps({"code": code, "out": out}) + "\n")
        proc.stdin.flush()
        ready = select.select([proc.stdout], [], [], timeout)[0]
        line = proc.stdout.readline() if ready else ""
        text = Path(out).read_text(errors="replace")
    finally:
        os.unlink(out)
    if not line:  # timed out, or the warm process died: the next case starts another
        proc.kill()
        _SERVER.clear()
        return -1, text + ("\n(timed out)" if not ready else "\n(the interpreter process died)")
    return int(line), text


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
            if (K.tiles(M, N, K_)[3] > 1) not in seen:  # a second run, into `out`: the same bits (deterministic)
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
            if (K.tiles(M, N, K_)[3] > 1) not in seen:  # a second run, into `out`: the same bits (deterministic)
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
    float64; T past one row block, K split (and not a multiple of the tile), the CUDA-core and the dot
    path (9+ rows), deterministic, the split counters back at zero."""
    _interpret("""
        from dsv4.kernels import _triton_mixes as K, _triton_splitk as S
        seen, repeated = set(), set()
        for T, J, Kd in ((1, 24, 16384), (3, 24, 4096), (6, 24, 1000), (16, 7, 2048), (2, 24, 64), (16, 24, 16384),
                          (20, 24, 1000)):
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
                if K.tiles(T, J, Kd)[3] > 1 and dtype not in repeated:  # split-K: the bits repeat (one run per dtype)
                    assert torch.equal(y, K.mix_sums(x, fn))
                    repeated.add(dtype)
                seen.add((K.tiles(T, J, Kd)[3] > 1, K.tiles(T, J, Kd)[0] >= 16))
        assert {s for s, _ in seen} == {True, False} and {d for _, d in seen} == {True, False}  # split, dot path
        assert repeated == {torch.bfloat16, torch.float32}
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
