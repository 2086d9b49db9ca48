"""The CuTe GEMVs' launch shapes (row blocks per CTA, warps per CTA) change how work is spread over the
GPU, never a row's arithmetic: each lane reads the same chunks in the same order and the warp reduces
them the same way. So every variant must equal the default launch bit for bit, tails included (N not
a multiple of a CTA's rows, K not a multiple of a step), with the in-kernel activation rounding on
and off, and wo_a's groups crossing block boundaries."""

from __future__ import annotations

import os

import pytest
import torch

from dsv4.kernels import launch
from test_kernels import random_fp4_bank, random_fp8_weight, random_nvfp4_bank, random_x

pytestmark = pytest.mark.gpu

VARIANTS = [dict(rb=2), dict(rb=4), dict(rb=3, warps=8), dict(warps=2), dict(rb8=2), dict(rb8=4),
            dict(rb8=3, warps=8)]


@pytest.fixture(autouse=True)
def _setup():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"torch seed {seed}")
    torch.manual_seed(seed)
    saved = dict(launch.TUNE)
    yield
    launch.TUNE.clear()
    launch.TUNE.update(saved)


def _variants(run):
    """run() under the default TUNE, then under each variant: every output equal to the default's."""
    base = run().clone()
    assert torch.isfinite(base).all(), "default launch left outputs unwritten"
    saved = dict(launch.TUNE)
    for v in VARIANTS:
        launch.TUNE.update(v)
        y = run()
        launch.TUNE.clear()
        launch.TUNE.update(saved)
        assert torch.equal(y, base), f"{v}: differs from the default launch"


def _poison(R, N):
    return torch.full((R, N), float("nan"), device="cuda")


@pytest.mark.parametrize("N,K", [(4096, 4096), (4096, 2048), (200, 2080)])
@pytest.mark.parametrize("quant", [False, True])
def test_fp4_grouped_blocks_bitwise(N, K, quant):
    if quant and K % 128:
        pytest.skip("the in-kernel rounding needs K % 128 == 0")
    E = 16
    w, s = random_fp4_bank(E, N, K, "cuda")
    for R, one in ((6, True), (6, False), (48, False)):
        rows = 1 if one else R
        x = torch.randn(rows, K, device="cuda").to(torch.bfloat16) if quant else random_x(rows, K, "cuda")
        idx = torch.randint(0, E, (R,), device="cuda")
        _variants(lambda: launch.fp4_grouped_gemv(x, w, s, idx, out=_poison(R, N), quant=quant))


def test_nvfp4_grouped_blocks_bitwise():
    E, N, K = 8, 2048, 4096
    w, s, g = random_nvfp4_bank(E, N, K, "cuda")
    x, idx = random_x(6, K, "cuda"), torch.randint(0, E, (6,), device="cuda", dtype=torch.int32)
    _variants(lambda: launch.nvfp4_grouped_gemv(x, w, s, g, idx, out=_poison(6, N)))


@pytest.mark.parametrize("M,N,K,G", [(1, 1536, 4096, 1), (1, 4096, 2048, 1), (3, 200, 272, 1), (2, 8192, 4096, 8),
                                     (1, 96, 1024, 8)])
@pytest.mark.parametrize("quant", [False, True])
def test_fp8_blocks_bitwise(M, N, K, G, quant):
    if quant and K % 128:
        pytest.skip("the in-kernel rounding needs K % 128 == 0")
    w, s = random_fp8_weight(N, K, "cuda")
    x = torch.randn(M * G, K, device="cuda").to(torch.bfloat16) if quant else random_x(M * G, K, "cuda")
    _variants(lambda: launch.fp8_gemv(x, w, s, out=_poison(M, N), groups=G, quant=quant))
