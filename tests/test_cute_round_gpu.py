"""The CuTe GEMVs' own FP8 activation rounding (quant=True, in shared memory or in registers) on a GPU.

The rounding is exact arithmetic (a power-of-two scale, the e4m3 grid), so a kernel that rounds x itself
must give bit for bit what the same kernel gives on x rounded by `fp8_fake_quant` first: same products,
same summation order. The activations are drawn to reach the rule's corners: blocks whose magnitudes
span the whole range, all-zero blocks (the 1e-4 floor), and blocks whose amax / 448 is exactly a power
of two (the scale's exponent is not bumped there), and values that round to e4m3 subnormals.
"""

from __future__ import annotations

import os

import pytest
import torch

from dsv4.kernels import launch
from dsv4.ops import quantize as Q
from test_kernels import random_fp4_bank, random_fp8_weight

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _seed():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"torch seed {seed}")
    torch.manual_seed(seed)
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if not launch._available():
        pytest.skip("needs the CuTe DSL")


@pytest.fixture(params=["smem", "registers"])
def place(request, monkeypatch):
    """Where the kernel rounds: once per CTA into shared memory (Q = 2, the default where x fits) or by
    every warp in registers (Q = 1: wo_a's groups, x rows over launch.TUNE["round_smem"] bytes)."""
    monkeypatch.setitem(launch.TUNE, "round_smem", 32768 if request.param == "smem" else 0)
    return request.param


def corner_x(R: int, K: int) -> torch.Tensor:
    """bf16 [R, K], unrounded, with per-128-block magnitudes from 2^-24 to 2^24 and the corner blocks."""
    nb = K // 128
    x = torch.randn(R, nb, 128, device="cuda") * torch.exp2(torch.randint(-24, 25, (R, nb, 1), device="cuda").float())
    kind = torch.randint(0, 5, (R, nb), device="cuda")
    x[kind == 0] = 0.0  # amax 0: the 1e-4 floor
    exact = kind == 1  # amax = 448 * 2^k: amax / 448 is a power of two, the scale is exactly that
    k = torch.randint(-20, 20, (R, nb), device="cuda").float()
    x[exact, 0] = (448.0 * torch.exp2(k[exact])) * torch.where(torch.rand_like(k[exact]) < 0.5, -1.0, 1.0)
    x[exact, 1:] = x[exact, 1:].clamp(-448, 448) * torch.exp2(k[exact])[:, None] / 8
    tiny = kind == 2  # a wide block: most values land on e4m3 subnormals or zero
    x[tiny] = x[tiny] * torch.exp2(-torch.randint(0, 16, (int(tiny.sum()), 128), device="cuda").float())
    return x.reshape(R, K).to(torch.bfloat16)


@pytest.mark.parametrize("M,N,K,G", [(1, 1536, 4096, 1), (1, 4096, 1024, 1), (4, 2048, 4096, 1), (3, 200, 384, 1),
                                     (9, 256, 7168, 1), (2, 8 * 128, 512, 8)])
def test_fp8_gemv_rounds_in_kernel_bit_for_bit(M, N, K, G, place):
    w, s = random_fp8_weight(N, K, "cuda")
    x = corner_x(M * G, K)
    y = launch.fp8_gemv(x, w, s, groups=G, quant=True)
    ref = launch.fp8_gemv(Q.fp8_fake_quant(x, 128), w, s, groups=G)
    assert torch.isfinite(ref).all()
    assert torch.equal(y, ref), f"max |diff| {(y - ref).abs().max().item():.3e}"
    plain = launch.fp8_gemv(x, w, s, groups=G)  # the unrounded x gives another result: the rounding ran
    assert not torch.equal(plain, ref)


@pytest.mark.parametrize("E,N,K,R", [(256, 4096, 4096, 6), (256, 4096, 2048, 6), (8, 96, 384, 13)])
def test_fp4_experts_round_in_kernel_bit_for_bit(E, N, K, R, place):
    w, s = random_fp4_bank(E, N, K, "cuda")
    idx = torch.randint(0, E, (R,), device="cuda", dtype=torch.int32)
    x = corner_x(R, K)
    y = launch.fp4_grouped_gemv(x, w, s, idx, quant=True)
    ref = launch.fp4_grouped_gemv(Q.fp8_fake_quant(x, 128), w, s, idx)
    assert torch.equal(y, ref), f"max |diff| {(y - ref).abs().max().item():.3e}"


def test_rounding_kernels_replay_in_a_graph(place):
    """Captured with fresh inputs copied in: the replay equals an eager call on the new x."""
    w, s = random_fp8_weight(2048, 4096, "cuda")
    x = corner_x(1, 4096)
    y = launch.fp8_gemv(x, w, s, quant=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg = launch.fp8_gemv(x, w, s, quant=True)
    x.copy_(corner_x(1, 4096))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, launch.fp8_gemv(x, w, s, quant=True)) and not torch.equal(yg, y)


def test_quant_needs_whole_blocks():
    w, s = random_fp8_weight(256, 272, "cuda")
    with pytest.raises(Exception, match="multiple of 128"):
        launch.fp8_gemv(torch.zeros(1, 272, device="cuda", dtype=torch.bfloat16), w, s, quant=True)


@pytest.mark.parametrize("quant", [False, True])
def test_experts_read_one_token_row_for_its_k_experts(quant, place):
    """Batch 1's routed rows are one token's row expanded k times (stride 0): try_expert hands the kernel
    that one row instead of copying it k times, and every expert row equals the call on the copied rows."""
    w, s = random_fp4_bank(64, 512, 1024, "cuda")
    idx = torch.randperm(64, device="cuda")[:6].to(torch.int32)
    x = corner_x(1, 1024)
    ref = launch.fp4_grouped_gemv(x.expand(6, 1024).contiguous(), w, s, idx, quant=quant)
    assert torch.equal(launch.fp4_grouped_gemv(x, w, s, idx, quant=quant), ref)
    y = launch.try_expert("fp4", x.expand(6, 1024), {"weight": w, "scale": s}, idx, quant=quant)
    assert y is not None and torch.equal(y, ref)
    assert not torch.equal(ref[0], ref[1])  # the rows went through different experts
