"""On a GPU: the grouped FP4 experts on tensor cores (dsv4/kernels/_cute_mma.py, SLOTS) behind the Triton
grouping launch (`DSV4_CUTE_MMA_SLOTS=1`), against float64 at Flash shapes and batch sizes 1-64 (6-384 rows),
the in-kernel activation rounding through identity experts bit for bit, graph replays bitwise equal to the
eager call under new routings (the last puts every row on one expert: more rows than one MMA's 8 columns),
and a printed timing table against the Triton GEMM on the same routings (`pytest -s`)."""

from __future__ import annotations

import pytest
import torch

from dsv4.ops import quantize as Q
from test_experts_gemm_gpu import (SHAPES, _bank, _call, _gen, _kernel, _ref64, _route, rounding_errors,
                                   us_per_routing)

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _slots_on():
    pytest.importorskip("cutlass")
    from dsv4.kernels import launch

    saved = dict(launch.TUNE)
    launch.TUNE["mma_slots"] = 1
    yield launch
    launch.TUNE.clear()
    launch.TUNE.update(saved)


def _ran_slots(launch) -> bool:
    return any(k[0] == "fp4_mma" and k[-1][7] for k in launch._CACHE)  # consts[7]: SLOTS


@pytest.mark.parametrize("shape", list(SHAPES))
def test_slots_match_float64(shape, rng, _slots_on):
    T = _kernel()
    N, K = SHAPES[shape]
    gen = _gen(rng)
    w, s, _ = _bank("fp4", N, K, gen)
    for R in (6, 24, 96, 384):
        x = torch.randn(R, K, device="cuda", generator=gen).bfloat16()
        idx = _route(R, gen)
        y = _call(T, "fp4", x, w, s, None, idx, out=torch.full((R, N), float("nan"), device="cuda"))
        ref = _ref64("fp4", x, w, s, None, idx)
        err = ((y.double() - ref).abs().amax(1) / ref.abs().amax(1)).max().item()
        print(f"slots {shape} R={R}: max error / row max |y| = {err:.2e}")
        assert err < 2e-6, (shape, R, err)
        assert torch.equal(y, _call(T, "fp4", x, w, s, None, idx))
    assert _ran_slots(_slots_on), "the tensor-core kernel did not run"


@pytest.mark.parametrize("shape", list(SHAPES))
def test_slots_round_the_activation(shape, rng):
    for R, err in rounding_errors(shape, rng, (6, 96)):
        assert err < 2e-6, (shape, R, err)


@pytest.mark.parametrize("quant", [False, True])
def test_slots_graph_replay_is_bitwise_equal_to_eager(quant, rng):
    T = _kernel()
    N, K = SHAPES["w2"]
    gen = _gen(rng)
    w, s, _ = _bank("fp4", N, K, gen)
    for R in (6, 96):
        x = torch.randn(R, K, device="cuda", generator=gen).bfloat16()
        idx = _route(R, gen)
        y = torch.empty(R, N, device="cuda")
        _call(T, "fp4", x, w, s, None, idx, out=y, quant=quant)  # compiles outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _call(T, "fp4", x, w, s, None, idx, out=y, quant=quant)
        for i in range(3):
            new = _route(R, gen) if i < 2 else torch.full((R,), 7, device="cuda", dtype=idx.dtype)
            idx.copy_(new)
            graph.replay()
            want = _call(T, "fp4", x, w, s, None, new, quant=quant)
            assert torch.equal(y, want), (quant, R, i)
            if i == 2:  # every row on expert 7: the chunks of 8 columns, against float64
                xr = Q.fp8_fake_quant(x, 128) if quant else x
                ref = _ref64("fp4", xr, w, s, None, new)
                assert ((y.double() - ref).abs().amax(1) / ref.abs().amax(1)).max().item() < 2e-6


def test_slots_timing_is_printed(rng, _slots_on):
    """us per call (50 calls in one graph, a routing each) with the tensor-core kernel and with the Triton GEMM."""
    T = _kernel()
    gen = _gen(rng)
    lines = []
    for shape, (N, K) in SHAPES.items():
        w, s, _ = _bank("fp4", N, K, gen)
        per_expert = N * K // 2 + s[0].numel()
        for R in (6, 96, 384):
            x = torch.randn(R, K, device="cuda", generator=gen).bfloat16()
            idxs = [_route(R, gen) for _ in range(50)]
            y = torch.empty(R, N, device="cuda")
            for on in (1, 0):
                _slots_on.TUNE["mma_slots"] = on
                us = us_per_routing(lambda idx: _call(T, "fp4", x, w, s, None, idx, out=y, quant=True), idxs)
                distinct = sum(len(i.unique()) for i in idxs) / 50
                lines.append(f"{'tensor-core' if on else 'triton':11s} {shape} N={N} K={K} R={R:3d}: {us:7.1f} us/call, "
                             f"{distinct * per_expert / us / 1e3:6.0f} GB/s")
    print("\n" + "\n".join(lines))
