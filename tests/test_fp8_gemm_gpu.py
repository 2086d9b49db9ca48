"""On a GPU: the Triton FP8 weight GEMM (dsv4/kernels/_triton_fp8.py) at Flash shapes against float64,
CUDA-graph replays bitwise equal to the eager call, and a timing table printed for the person running
it (`pytest -s` shows it; nothing about speed is asserted). The CPU interpreter runs are in
tests/test_triton_fp8_interpret.py."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

# (N, K, groups): wq (4096 x 4096), wq_a|wkv-like (1536 x 4096), wo_a (8192 x 1024, 8 groups of 1024
# rows, each reading its own x row m*8 + g), a wide 32768 x 1024
SHAPES = [(4096, 4096, 1), (1536, 4096, 1), (8192, 1024, 8), (32768, 1024, 1)]


def _kernel():
    pytest.importorskip("triton")
    from dsv4.kernels import _triton_fp8

    return _triton_fp8


def _gen(rng: torch.Generator) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(int(torch.randint(2**62, (), generator=rng)))


def _weight(N: int, K: int, gen: torch.Generator):
    from dsv4.ops.quantize import quantize_fp8_blockwise

    return quantize_fp8_blockwise(torch.randn(N, K, device="cuda", generator=gen) * 0.02)


def _x(rows: int, K: int, gen: torch.Generator) -> torch.Tensor:
    from dsv4.ops.quantize import fp8_fake_quant

    return fp8_fake_quant(torch.randn(rows, K, device="cuda", generator=gen)).bfloat16()


def _ref64(x, w, s, groups):
    from dsv4.ops.quantize import dequantize_fp8_blockwise

    wd = dequantize_fp8_blockwise(w, s, dtype=torch.float64)
    xg = x.double().unflatten(0, (-1, groups))  # [M, G, K]
    return torch.einsum("mgk,gnk->mgn", xg, wd.unflatten(0, (groups, -1))).flatten(1)


@pytest.mark.parametrize("N,K,groups", SHAPES)
@pytest.mark.parametrize("M", [1, 2, 3, 16, 64])
def test_fp8_gemm_matches_float64(M, N, K, groups, rng):
    F = _kernel()
    gen = _gen(rng)
    w, s = _weight(N, K, gen)
    x = _x(M * groups, K, gen)
    y = F.fp8_gemm(x, w, s, groups=groups)
    ref = _ref64(x, w, s, groups)
    err = ((y.double() - ref).abs().amax(1) / ref.abs().amax(1)).max().item()
    assert err < 2e-6, (M, N, K, groups, err, F.tiles(M, N, K, groups))
    assert torch.equal(y, F.fp8_gemm(x, w, s, groups=groups))
    assert torch.equal(y, F.fp8_gemm(x, w, s.view(torch.uint8), groups=groups))  # scale as bytes
    out = torch.full((M, N), float("nan"), device="cuda")
    assert F.fp8_gemm(x, w, s, groups=groups, out=out) is out and torch.equal(out, y)


# quant=True runs e4m3 x e4m3 tensor-core dots (one per 128-wide K block, scaled and added in fp32):
# exact products, but Hopper's FP8 MMA keeps fewer accumulator bits than fp32 (DeepSeek-V3 report:
# ~14), as the released FP8 GEMM does. Measured on an H200: 2.2e-4 to 5.7e-4 of a row's max |y| at
# the Flash shapes. Wrong scales or a mis-ordered K would be errors of order 1.
FP8_DOT_TOL = 1e-3


@pytest.mark.parametrize("N,K,groups", SHAPES)
@pytest.mark.parametrize("M", [1, 16])
def test_fp8_gemm_rounds_the_activation_as_fp8_fake_quant(M, N, K, groups, rng, capsys):
    """quant=True on unrounded x (a different power-of-two magnitude per 128 block): through identity
    weights the output is fp8_fake_quant(x) bit for bit (the hardware path of the in-kernel rounding);
    through random weights it matches the float64 product of the rounded x within FP8_DOT_TOL."""
    from dsv4.ops.quantize import fp8_fake_quant, quantize_fp8_blockwise

    F = _kernel()
    gen = _gen(rng)
    w, s = _weight(N, K, gen)
    mag = torch.exp2(torch.randint(-30, 31, (M * groups, K // 128), device="cuda", generator=gen).float())
    x = (torch.randn(M * groups, K, device="cuda", generator=gen) * mag.repeat_interleave(128, 1)).bfloat16()
    rounded = fp8_fake_quant(x, 128)
    assert not torch.equal(rounded, x)
    eye, es = quantize_fp8_blockwise(torch.eye(K, device="cuda"))
    assert torch.equal(F.fp8_gemm(x, eye, es, quant=True), rounded.float())
    y = F.fp8_gemm(x, w, s, groups=groups, quant=True)
    ref = _ref64(rounded, w, s, groups)
    err = ((y.double() - ref).abs().amax(1) / ref.abs().amax(1)).max().item()
    with capsys.disabled():
        print(f"\nfp8_gemm quant M={M} N={N} K={K} G={groups}: max error / row max |y| = {err:.2e}")
    assert err < FP8_DOT_TOL, (M, N, K, groups, err)
    assert torch.equal(y, F.fp8_gemm(x, w, s, groups=groups, quant=True))


@pytest.mark.parametrize("N,K,groups", SHAPES)
@pytest.mark.parametrize("M", [1, 3, 16, 64])
def test_fp8_gemm_graph_replay_is_bitwise_equal_to_eager(M, N, K, groups, rng):
    F = _kernel()
    gen = _gen(rng)
    w, s = _weight(N, K, gen)
    x = _x(M * groups, K, gen)
    y = torch.empty(M, N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up off the capture
        F.fp8_gemm(x, w, s, groups=groups, out=y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        F.fp8_gemm(x, w, s, groups=groups, out=y)
    for _ in range(2):
        x.copy_(_x(M * groups, K, gen))
        graph.replay()
        assert torch.equal(y, F.fp8_gemm(x, w, s, groups=groups))


def test_fp8_gemm_timing_is_printed(rng):
    """us per call: 50 calls captured in one CUDA graph, its replay timed with CUDA events (eager Triton
    launches are host-bound). The weights cycle through copies worth >= 256 MB so the figure is HBM's,
    not L2's. GB/s = e4m3 weight bytes (N*K) / time."""
    F = _kernel()
    gen = _gen(rng)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for N, K, groups in SHAPES:
        copies = max(1, -(-(256 << 20) // (N * K)))
        ws = [_weight(N, K, gen) for _ in range(copies)]
        for M, quant in ((1, False), (1, True), (2, False), (4, False), (16, False), (16, True), (64, False)):
            x = _x(M * groups, K, gen)
            y = torch.empty(M, N, device="cuda")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                F.fp8_gemm(x, *ws[0], groups=groups, out=y, quant=quant)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(50):
                    F.fp8_gemm(x, *ws[i % copies], groups=groups, out=y, quant=quant)
            graph.replay()  # warm
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            us = start.elapsed_time(end) * 1e3 / 50
            bm, bn, bk, splits = F.tiles(M, N, K, groups)
            print(f"fp8_gemm M={M:2d}{' q' if quant else '  '} N={N} K={K} G={groups}: {us:7.1f} us/call, {N * K / us / 1e3:6.0f} GB/s "
                  f"(BLOCK {bm}x{bn}x{bk}, splits {splits})")
            del graph
