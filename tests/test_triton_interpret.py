"""The Triton kernels (bf16 GEMV, Sinkhorn) on the CPU through Triton's interpreter, against float64.

Skipped where Triton is not installed (the CPU torch wheels don't bring it). Each case runs in a
child process because TRITON_INTERPRET is read when a kernel is defined. The GPU runs of the same
kernels are in tests/test_fuse_gpu.py.
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


def _interpret(body: str) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    code = f"import torch\ng = torch.Generator().manual_seed({seed})\n" + textwrap.dedent(body) + "\nprint('ok')\n"
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
        for M, N, K_ in ((1, 512, 4096), (1, 1000, 1000), (4, 64, 4096), (3, 300, 200), (16, 256, 2048), (2, 7, 4000)):
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
