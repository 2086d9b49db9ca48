"""On a GPU: the Triton grouped expert GEMM (dsv4/kernels/_triton_experts.py) at Flash shapes against
float64, CUDA-graph replays bitwise equal to the eager call with a new routing staged before each
replay (the grouping reads idx on the device only), and a printed timing table (`pytest -s`). The CPU
interpreter runs are in tests/test_triton_experts_interpret.py.

Banks are random bytes: every e2m1 code pair, UE8M0 scale bytes 2^-20..2^4, e4m3 scale bytes all
positive finite values (subnormals included), global scales random powers of two times (1, 2).
"""

from __future__ import annotations

import pytest
import torch

from dsv4.ops import quantize as Q

pytestmark = pytest.mark.gpu

E = 32
SHAPES = {"w13": (4096, 4096), "w2": (4096, 2048)}  # (N, K)
TOP_K = 6


@pytest.fixture(autouse=True)
def _triton_gemm():
    """This file times and checks the Triton GEMM: the tensor-core CuTe kernel that may take its slots (at
    <= 4 rows per expert) is off here (tests/test_cute_mma_slots_gpu.py has it)."""
    from dsv4.kernels import launch

    saved = launch.TUNE["mma_slots"]
    launch.TUNE["mma_slots"] = 0
    yield
    launch.TUNE["mma_slots"] = saved


def _kernel():
    pytest.importorskip("triton")
    from dsv4.kernels import _triton_experts

    return _triton_experts


def _gen(rng: torch.Generator) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(int(torch.randint(2**62, (), generator=rng)))


def _bank(fmt: str, N: int, K: int, gen: torch.Generator):
    w = torch.randint(0, 256, (E, N, K // 2), device="cuda", generator=gen, dtype=torch.uint8).view(torch.int8)
    if fmt == "fp4":
        s = torch.randint(107, 132, (E, N, K // 32), device="cuda", generator=gen, dtype=torch.uint8)
        return w, s.view(torch.float8_e8m0fnu), None
    s = torch.randint(1, 0x7F, (E, N, K // 16), device="cuda", generator=gen, dtype=torch.uint8)  # no NaN
    g = torch.exp2(torch.randint(-12, -4, (E,), device="cuda", generator=gen).float())
    g = g * (1 + torch.rand(E, device="cuda", generator=gen))
    return w, s.view(torch.float8_e4m3fn), g


def _route(R: int, gen: torch.Generator) -> torch.Tensor:
    """R / TOP_K tokens, each to TOP_K distinct experts (as the router does)."""
    return torch.rand(R // TOP_K, E, device="cuda", generator=gen).argsort(dim=1)[:, :TOP_K].reshape(-1)


def _ref64(fmt, x, w, s, g, idx):
    y = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float64, device="cuda")
    for e in idx.unique().tolist():
        vals = Q._e2m1_values(Q.unpack_fp4(w[e])).double()
        sc = Q.e8m0_to_float(s[e]).double() if fmt == "fp4" else s[e].float().double() * float(g[e])
        we = (vals.unflatten(-1, (sc.shape[-1], -1)) * sc[..., None]).flatten(-2)
        rows = (idx == e).nonzero().squeeze(1)
        y[rows] = x[rows].double() @ we.t()
    return y


def _call(T, fmt, x, w, s, g, idx, out=None, quant=False):
    return T.grouped_expert_gemm(fmt, x, w, s, idx, global_scale=g, out=out, quant=quant)



@pytest.mark.parametrize("fmt", ["fp4", "nvfp4"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_grouped_experts_match_float64(fmt, shape, rng):
    T = _kernel()
    N, K = SHAPES[shape]
    gen = _gen(rng)
    w, s, g = _bank(fmt, N, K, gen)
    for R in (6, 24, 96, 384):
        x = torch.randn(R, K, device="cuda", generator=gen).bfloat16()
        idx = _route(R, gen)
        y = _call(T, fmt, x, w, s, g, idx)
        ref = _ref64(fmt, x, w, s, g, idx)
        err = ((y.double() - ref).abs().amax(1) / ref.abs().amax(1)).max().item()
        assert err < 2e-6, (fmt, shape, R, err)
        assert torch.equal(y, _call(T, fmt, x, w, s, g, idx))


def rounding_errors(shape: str, rng, rows) -> list[tuple[int, float]]:
    """quant=True on unrounded x (each 128-block at its own power-of-two magnitude), for each row count:
    through identity experts the output is fp8_fake_quant(x) bit for bit (the hardware path of the
    rounding); through a random FP4 bank, deterministic, and (rows, max error / row max |y|) against
    float64 on the rounded x is returned."""
    T = _kernel()
    N, K = SHAPES[shape]
    gen = _gen(rng)
    w, s, _ = _bank("fp4", N, K, gen)
    eye = Q.quantize_fp4(torch.eye(K, device="cuda"))
    ew, es = eye[0].expand(E, K, K // 2).contiguous(), eye[1].expand(E, K, K // 32).contiguous()
    out = []
    for R in rows:
        mag = torch.exp2(torch.randint(-30, 31, (R, K // 128), device="cuda", generator=gen).float())
        x = (torch.randn(R, K, device="cuda", generator=gen) * mag.repeat_interleave(128, 1)).bfloat16()
        rounded = Q.fp8_fake_quant(x, 128)
        assert not torch.equal(rounded, x)
        idx = _route(R, gen)
        assert torch.equal(_call(T, "fp4", x, ew, es, None, idx, quant=True), rounded.float())
        y = _call(T, "fp4", x, w, s, None, idx, quant=True)
        ref = _ref64("fp4", rounded, w, s, None, idx)
        out.append((R, ((y.double() - ref).abs().amax(1) / ref.abs().amax(1)).max().item()))
        assert torch.equal(y, _call(T, "fp4", x, w, s, None, idx, quant=True))
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
def test_grouped_experts_round_the_activation_in_the_kernel(shape, rng, capsys):
    for R, err in rounding_errors(shape, rng, (96, 384)):
        with capsys.disabled():
            print(f"\nexperts fp4 quant {shape} R={R}: max error / row max |y| = {err:.2e}")
        assert err < 2e-6, (shape, R, err)


@pytest.mark.parametrize("fmt,quant", [("fp4", False), ("nvfp4", False), ("fp4", True)])
def test_grouped_experts_graph_replay_is_bitwise_equal_to_eager(fmt, quant, rng):
    T = _kernel()
    N, K = SHAPES["w2"]
    gen = _gen(rng)
    w, s, g = _bank(fmt, N, K, gen)
    for R in (6, 96):
        x = torch.randn(R, K, device="cuda", generator=gen).bfloat16()
        idx = _route(R, gen)
        y = torch.empty(R, N, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile and warm up off the capture
            _call(T, fmt, x, w, s, g, idx, out=y, quant=quant)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _call(T, fmt, x, w, s, g, idx, out=y, quant=quant)
        for i in range(3):  # a new routing (the last: all rows to one expert) before each replay
            new = _route(R, gen) if i < 2 else torch.full((R,), 7, device="cuda", dtype=idx.dtype)
            idx.copy_(new)
            graph.replay()
            assert torch.equal(y, _call(T, fmt, x, w, s, g, new, quant=quant)), (fmt, quant, R, i)


def us_per_routing(call, idxs) -> float:
    """us per call of `call(idx)` over the routings idxs, all captured in one CUDA graph (compiled and warmed
    up on the first routing outside the capture), from one replay after a warm one."""
    call(idxs[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for idx in idxs:
            call(idx)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / len(idxs)


def test_grouped_experts_timing_is_printed(rng):
    """us per call from 50 calls captured in one graph (each call its own routing, so the experts
    change from call to call as in decode); GB/s = bytes of the distinct experts selected / time."""
    T = _kernel()
    gen = _gen(rng)
    lines = []
    for fmt, quant in (("fp4", False), ("fp4", True), ("nvfp4", False)):
        for shape, (N, K) in SHAPES.items():
            w, s, g = _bank(fmt, N, K, gen)
            per_expert = N * K // 2 + s[0].numel()
            for R in (6, 24, 96, 384):
                x = torch.randn(R, K, device="cuda", generator=gen).bfloat16()
                idxs = [_route(R, gen) for _ in range(50)]
                y = torch.empty(R, N, device="cuda")
                us = us_per_routing(lambda idx: _call(T, fmt, x, w, s, g, idx, out=y, quant=quant), idxs)
                distinct = sum(len(i.unique()) for i in idxs) / 50
                bn, bk, P = T.tiles(R, E, N, K)
                lines.append(f"{fmt:5s}{' q' if quant else '  '} {shape} N={N} K={K} R={R:3d}: {us:7.1f} us/call, {distinct:4.1f} experts, "
                             f"{distinct * per_expert / us / 1e3:6.0f} GB/s (BLOCK_N {bn}, BLOCK_K {bk}, slots {P})")
            del w, s, g
    print("\n" + "\n".join(lines))
