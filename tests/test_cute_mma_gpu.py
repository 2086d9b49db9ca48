"""The tensor-core FP4 expert GEMM (dsv4/kernels/_cute_mma.py) at batch 1 on a GPU (its grouped slots:
tests/test_cute_mma_slots_gpu.py).

It rounds the activation itself (quant=True) or takes x as it is, and sums in another order than the
CUDA-core kernel, so it is held to the twin on the rounded x (relative error <= 1e-5, the CUDA-core kernel's
bound), at the launch shapes it can take (warps, prefetch depth), with N tails, one x row for every expert
row (batch 1's w1 | w3) and a row per expert row (w2), activations spanning 2^-24..2^24 per 128-block;
deterministic, and a graph replay equal to the eager call bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from dsv4.kernels import launch
from dsv4.ops import gemv
from dsv4.ops import quantize as Q
from test_cute_round_gpu import _seed, corner_x  # noqa: F401 (_seed: a fixture)
from test_kernels import random_fp4_bank

pytestmark = pytest.mark.gpu

BOUND = 1e-5
SHAPES = [(256, 4096, 4096, 6, True), (256, 4096, 2048, 6, False), (8, 200, 2048, 13, False),
          (16, 3072, 7168, 6, True)]
VARIANTS = [{}, {"mma_warps": 8}, {"mma_pd": 2}, {"mma_pd": 8}]


@pytest.fixture(autouse=True)
def _setup(_seed):  # test_cute_round_gpu's: a fresh seed, skips without CUDA or the CuTe DSL
    saved = dict(launch.TUNE)
    launch.TUNE["mma"] = 1
    yield
    launch.TUNE.clear()
    launch.TUNE.update(saved)


def _relerr(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _case(E, N, K, R, one):
    w, s = random_fp4_bank(E, N, K, "cuda")
    idx = torch.randint(0, E, (R,), device="cuda", dtype=torch.int32)
    x = corner_x(1 if one else R, K)
    return w, s, idx, x


@pytest.mark.parametrize("quant", [True, False])
@pytest.mark.parametrize("E,N,K,R,one", SHAPES)
def test_mma_matches_the_twin(E, N, K, R, one, quant):
    w, s, idx, x = _case(E, N, K, R, one)
    xq = (Q.fp8_fake_quant(x, 128) if quant else x).expand(R, K)
    ref = torch.cat([gemv.fp4_grouped_gemv_ref(xq[i:i + 4], w, s, idx[i:i + 4]) for i in range(0, R, 4)])
    for v in VARIANTS:
        launch.TUNE.update(v)
        y = launch.fp4_grouped_gemv(x, w, s, idx, out=torch.full((R, N), float("nan"), device="cuda"), quant=quant)
        for k in v:
            launch.TUNE[k] = None
        assert torch.isfinite(y).all(), f"{v}: unwritten outputs"
        err = _relerr(y, ref)
        print(f"mma {E}x{N}x{K} rows={R} one={one} quant={quant} {v} relerr={err:.2e}")
        assert err <= BOUND, f"{v}: {err}"
    assert any(k[0] == "fp4_mma" for k in launch._CACHE), "the tensor-core kernel did not run"


def test_mma_deterministic_and_replays_bitwise():
    E, N, K, R = 32, 4096, 4096, 6
    w, s, idx, x = _case(E, N, K, R, True)
    y1 = launch.fp4_grouped_gemv(x, w, s, idx, quant=True)
    assert torch.equal(y1, launch.fp4_grouped_gemv(x, w, s, idx, quant=True))
    xs, ids, out = x.clone(), idx.clone(), torch.empty(R, N, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch.fp4_grouped_gemv(xs, w, s, ids, out=out, quant=True)
    x2, idx2 = corner_x(1, K), torch.randint(0, E, (R,), device="cuda", dtype=torch.int32)
    xs.copy_(x2)
    ids.copy_(idx2)
    g.replay()
    assert torch.equal(out, launch.fp4_grouped_gemv(x2, w, s, idx2, quant=True))


def test_mma_agrees_with_the_cuda_core_kernel():
    """Both kernels against each other on the model's batch-1 w1 | w3 shape (different summation orders)."""
    w, s, idx, x = _case(64, 4096, 4096, 6, True)
    y = launch.fp4_grouped_gemv(x, w, s, idx, quant=True)
    launch.TUNE["mma"] = 0
    core = launch.fp4_grouped_gemv(x, w, s, idx, quant=True)
    assert _relerr(y, core) <= 2 * BOUND
