"""On a GPU: the Triton bf16 GEMV's two paths (CUDA cores below TC_MIN_M rows, tensor cores from there)
against float64, CUDA-graph replays bitwise equal to the eager call, and the weight-stream bandwidth
printed for the person running it (`pytest -s` shows it). The CPU interpreter runs are in
tests/test_triton_interpret.py."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

K_DIM = 4096


def _kernel():
    pytest.importorskip("triton")
    from dsv4.kernels import _triton_gemv

    return _triton_gemv


def _inputs(M: int, N: int, rng: torch.Generator, copies: int = 1):
    gen = torch.Generator(device="cuda").manual_seed(int(torch.randint(2**62, (), generator=rng)))
    x = torch.randn(M, K_DIM, device="cuda", generator=gen)
    ws = [torch.randn(N, K_DIM, device="cuda", generator=gen).bfloat16() for _ in range(copies)]
    return x, ws


@pytest.mark.parametrize("N", [16384, 2048])  # head-like (one pass over K) and split-K
@pytest.mark.parametrize("M", [1, 4, 16, 64])
def test_bf16_gemv_matches_float64(M, N, rng):
    K = _kernel()
    x, (w,) = _inputs(M, N, rng)
    assert K.tiles(M, N, K_DIM)[4] == (M >= K.TC_MIN_M or N >= K.TC_WIDE_N)
    y = K.bf16_gemv(x, w)
    ref = x.double() @ w.double().t()
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    assert err < 2e-6, (M, N, err, K.tiles(M, N, K_DIM))
    assert torch.equal(y, K.bf16_gemv(x, w))


@pytest.mark.parametrize("N", [16384, 2048])
@pytest.mark.parametrize("M", [1, 16, 64])
def test_bf16_gemv_graph_replay_is_bitwise_equal_to_eager(M, N, rng):
    K = _kernel()
    x, (w,) = _inputs(M, N, rng)
    y = torch.empty(M, N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up off the capture
        K.bf16_gemv(x, w, out=y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        K.bf16_gemv(x, w, out=y)
    for _ in range(2):
        x.copy_(torch.randn(M, K_DIM, device="cuda"))
        graph.replay()
        assert torch.equal(y, K.bf16_gemv(x, w))


@pytest.mark.parametrize("N", [16384, 2048])
def test_bf16_gemv_bandwidth_is_printed(N, rng):
    """N*K*2 weight bytes per call over the time of 50 calls; the weights cycle through copies worth
    >= 256 MB so the figure is HBM's, not L2's (an H200's L2 holds N = 2048's 16 MB)."""
    K = _kernel()
    copies = max(1, -(-(256 << 20) // (N * K_DIM * 2)))
    x64, ws = _inputs(64, N, rng, copies)
    for M in (1, 4, 16, 64):
        x = x64[:M].contiguous()
        y = torch.empty(M, N, device="cuda")
        for w in ws:
            K.bf16_gemv(x, w, out=y)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(50):
            K.bf16_gemv(x, ws[i % copies], out=y)
        end.record()
        end.synchronize()
        us = start.elapsed_time(end) * 1e3 / 50
        bm, bn, bk, splits, tc = K.tiles(M, N, K_DIM)
        print(f"bf16_gemv M={M:2d} N={N} K={K_DIM}: {us:7.1f} us/call, {N * K_DIM * 2 / us / 1e3:6.0f} GB/s "
              f"({'tensor cores' if tc else 'CUDA cores'}, BLOCK {bm}x{bn}x{bk}, splits {splits})")
