"""On a GPU: the Triton top-k (dsv4/kernels/_triton_topk.py) against torch.topk, one launch per call,
bitwise replays inside a CUDA graph, and a printed timing table (run with -s to see it).

Semantics checked: the k largest per row in ascending index order, ties at the k-th value to the
lowest indices (= the first k of a stable descending sort). Interpreter runs on the CPU:
tests/test_triton_topk_interpret.py.
"""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
from dsv4.kernels import ops

pytestmark = pytest.mark.gpu

SHAPES = [(R, n, k) for R, n in ((1, 6), (3, 32), (16, 32), (2, 100), (1, 4096), (5, 4096), (16, 4200), (3, 5000), (1, 8200), (2, 20000))
          for k in sorted({1, 6, 512, n}) if k <= n]



def _want(x, k):
    idx = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k].sort(dim=-1).values
    return x.gather(-1, idx), idx


def _rows(R, n, rng):
    """Continuous rows, then (from the third row on) the hard ones: -inf-heavy, duplicates, all equal."""
    x = torch.randn(R, n, generator=rng) * 10
    if R >= 3:
        x[1] = torch.where(torch.rand(n, generator=rng) < 0.9, float("-inf"), x[1])
        x[2] = torch.randint(0, 4, (n,), generator=rng).float()
    if R >= 4:
        x[3] = float("-inf")
    return x.cuda()


@pytest.mark.parametrize("R,n,k", SHAPES)
def test_topk_matches_torch_topk(R, n, k, rng, kernels_on):
    x = _rows(R, n, rng)
    v, i = ops.topk(x, k)
    wv, wi = _want(x, k)
    assert torch.equal(i, wi) and torch.equal(v, wv)
    if R < 3:  # distinct values: the same set as torch.topk
        ref = x.topk(k, dim=-1)
        assert torch.equal(v.sort(dim=-1, descending=True).values, ref.values)
        assert torch.equal(i, ref.indices.sort(dim=-1).values)
    v2, i2 = ops.topk(x, k)
    assert torch.equal(v.view(torch.int32), v2.view(torch.int32)) and torch.equal(i, i2)


def test_topk_leading_dims_and_fallbacks(rng, kernels_on):
    x = torch.randn(2, 3, 300, generator=rng).cuda()
    v, i = kernels.topk(x, 20)
    assert v.shape == i.shape == (2, 3, 20)
    assert torch.equal(i.view(6, 20), _want(x.view(6, 300), 20)[1])
    assert kernels.topk(x.double(), 20) is None and kernels.topk(x.cpu(), 20) is None
    long_row = torch.randn(1, kernels.TOPK_MAX_ROW + 1, generator=rng).cuda()
    assert kernels.topk(long_row, 512) is None  # slower than torch.topk there: the caller keeps it


@pytest.mark.parametrize("R,n,k", [(1, 32, 6), (4, 4096, 512), (2, 20000, 512)])
def test_topk_is_one_launch(R, n, k, rng, kernels_on):
    from torch.profiler import ProfilerActivity, profile

    x = _rows(R, n, rng)
    ops.topk(x, k)  # compiles
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ops.topk(x, k)
        torch.cuda.synchronize()
    launched = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert len(launched) == 1 and ("_topk_rank_kernel" in launched[0] or "_topk_select_kernel" in launched[0]), launched


@pytest.mark.parametrize("R,n,k", [(16, 32, 6), (4, 4096, 512), (2, 256, 256)])
def test_topk_graph_replay_is_bitwise_eager(R, n, k, rng, kernels_on):
    x = _rows(R, n, rng)
    ops.topk(x, k)  # compiles outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_v, out_i = ops.topk(x, k)
    for _ in range(3):
        x.copy_(_rows(R, n, rng))
        g.replay()
        v, i = ops.topk(x, k)
        torch.cuda.synchronize()
        assert torch.equal(out_v.view(torch.int32), v.view(torch.int32)) and torch.equal(out_i, i)
        assert torch.equal(out_i, _want(x, k)[1])


def _us_per_call(fn, calls=200):
    """Device time per call: `calls` calls captured in one CUDA graph (as in a decode step), replayed."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / calls


def test_topk_timing_table(rng, kernels_on):
    """Printed, not asserted: us per call inside a CUDA graph, Triton vs torch.topk."""
    rows = []
    for R, n, k in ((1, 4096, 512), (1, 4132, 512), (16, 4096, 512), (1, 32, 6), (16, 32, 6),
                    (1, 256, 256), (1, 16384, 512), (1, 65536, 512), (1, 262144, 512)):
        x = torch.randn(R, n, generator=rng).cuda()
        ours = _us_per_call(lambda: ops.topk(x, k))
        ref = _us_per_call(lambda: torch.topk(x, k, dim=-1))
        rows.append(f"R={R:<3d} n={n:<7d} k={k:<4d} triton {ours:8.2f} us   torch.topk {ref:8.2f} us")
    print("\n" + "\n".join(rows))
