"""The Triton top-k (dsv4/kernels/_triton_topk.py) on the CPU through Triton's interpreter, and its
integration points on the CPU (plain torch: the dispatcher answers None, the callers keep torch.topk).

Interpreter cases run in a child process (TRITON_INTERPRET is read when a kernel is defined), as in
tests/test_triton_interpret.py; they are skipped where Triton is not installed. The kernel's
semantics: the k largest per row in ascending index order, ties at the k-th value to the lowest
indices, i.e. the first k of a stable descending sort. GPU runs: tests/test_topk_gpu.py.
"""

from __future__ import annotations

import importlib.util
import os
import textwrap
from pathlib import Path

import pytest
import torch
from test_triton_interpret import run_interpreted

import dsv4
from dsv4 import kernels
from dsv4.decode.static import StaticDecoder

ROOT = Path(__file__).resolve().parent.parent

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="Triton not installed (its interpreter runs the kernels)")

# the reference every interpreter case compares against, and the shapes (n = 4132: a block of 4096
# and a tail block of 64; n = 20000 is above the kernel's in-register BLOCK_MAX = 8192: three chunks
# re-read per step)
_PRELUDE = """
from dsv4.kernels import _triton_topk as K
NS = (6, 32, 100, 4096, 4132, 20000)
def ks(n):
    return sorted({k for k in (1, 6, 512, n) if k <= n})
def want(x, k):
    idx = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k].sort(dim=-1).values
    return x.gather(-1, idx), idx
def check(x, k, tag):
    v, i = K.topk(x, k)
    wv, wi = want(x, k)
    assert v.dtype == torch.float32 and i.dtype == torch.int64 and v.shape == i.shape == (x.shape[0], k), tag
    assert torch.equal(i, wi), (tag, (i != wi).nonzero()[:4].tolist())
    assert torch.equal(v, wv), tag
    v2, i2 = K.topk(x, k)  # deterministic: bitwise the same again
    assert torch.equal(v.view(torch.int32), v2.view(torch.int32)) and torch.equal(i, i2), tag
    return v, i
"""


def _interpret(body: str) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    code = (f"import torch\ng = torch.Generator().manual_seed({seed})\n" + textwrap.dedent(_PRELUDE)
            + textwrap.dedent(body) + "\nprint('ok')\n")
    status, out = run_interpreted(code)
    assert status == 0 and out.strip().endswith("ok"), f"seed {seed}\n{out[-3000:]}"


@needs_triton
def test_topk_kernel_matches_torch_topk_on_continuous_values():
    _interpret("""
        for n in NS:
            for k in ks(n):
                R = int(torch.randint(1, 6, (1,), generator=g))
                x = torch.randn(R, n, generator=g) * float(torch.rand(1, generator=g) * 100)
                v, i = check(x, k, (R, n, k))
                ref = x.topk(k, dim=-1)
                assert torch.equal(v.sort(dim=-1, descending=True).values, ref.values), (R, n, k)
                assert torch.equal(i, ref.indices.sort(dim=-1).values), (R, n, k)
                assert bool((i.diff(dim=-1) > 0).all())  # ascending index order
    """)


@needs_triton
def test_topk_kernel_takes_the_lowest_indices_among_ties_and_minus_inf():
    _interpret("""
        for n in NS:
            for k in ks(n):
                R = 5
                x = torch.randn(R, n, generator=g)
                # fewer visible than k (the indexer early in a sequence): all of them, then the first -inf
                x[0] = float("-inf")
                x[0, torch.randperm(n, generator=g)[: k // 2]] = torch.randn(k // 2, generator=g)
                x[1] = float("-inf")  # nothing visible at all
                x[2] = torch.randint(0, 4, (n,), generator=g).float()  # many duplicates at the threshold
                x[3] = 1.5  # all equal
                x[4] = torch.where(torch.rand(n, generator=g) < 0.5, float("-inf"),
                                   torch.randint(-3, 3, (n,), generator=g).float())
                v, i = check(x, k, (n, k))
                vis = int((x[0] > float("-inf")).sum())
                assert bool((v[0, :] > float("-inf")).sum() == vis)
                assert torch.equal(i[1], torch.arange(k))
    """)


@needs_triton
def test_topk_kernel_extremes_and_layouts():
    _interpret("""
        big = torch.finfo(torch.float32).max
        x = torch.tensor([[0.0, -0.5, big, -big, float("inf"), 1e-38, -1e-38, 3.0, float("-inf"), 2.0] * 7])
        for k in (1, 3, 10, 70):
            check(x, k, ("extremes", k))
        for n in (65, 129, 5000, 5121, 8192, 8193, 10241):  # around the rank / tail / in-register / chunk boundaries
            x = torch.randn(2, n, generator=g)
            for k in sorted({1, 64, n - 1, n}):
                check(x, k, (n, k))
        x = torch.randn(3, 2 * 100, generator=g)[:, ::2]  # not contiguous: the wrapper copies
        check(x, 6, "strided")
        assert K.topk(torch.randn(0, 40, generator=g), 6)[0].shape == (0, 6)
    """)


def test_topk_dispatcher_answers_none_on_cpu_and_when_off(rng):
    x = torch.randn(3, 4096, generator=rng)
    before = kernels.use(True)
    try:
        assert kernels.topk(x, 512) is None  # CPU tensors
        assert kernels.topk(x.double(), 512) is None
    finally:
        kernels.use(False)
    try:
        assert kernels.topk(x, 512) is None  # switched off
    finally:
        kernels.use(before)


def test_topk_custom_op_twin_on_cpu_has_the_kernel_semantics(rng):
    from dsv4.kernels import ops

    x = torch.randint(0, 3, (4, 300), generator=rng).float()
    x[1] = float("-inf")
    v, i = ops.topk(x, 100)
    want = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :100].sort(dim=-1).values
    assert torch.equal(i, want) and torch.equal(v, x.gather(1, want))
    torch.library.opcheck(ops.topk, (x, 100))  # schema, fake impl, dynamo/AOT tracing


def test_topk_call_sites_unchanged_on_cpu(rng):
    """Gate.forward and StaticAttention.select with the switch on give bitwise what they gave before
    (the dispatcher answers None on the CPU, so torch.topk runs as it always did)."""
    seed = int(torch.randint(0, 999, (1,), generator=rng))
    model = dsv4.load("tiny", dtype="float32", n_layers=2, seed=seed)
    prompt = torch.randint(0, 1024, (2, 9), generator=rng)
    ids = torch.randint(0, 1024, (5, 2), generator=rng)

    def run(flag):
        before = kernels.use(flag)
        try:
            model.reset()
            dec = StaticDecoder(model, 2)
            dec.prefill(prompt)
            return torch.stack([dec.decode(i).clone() for i in ids])
        finally:
            kernels.use(before)

    off = run(False)
    assert torch.equal(run(True), off)

    gate = next(m for m in model.modules() if type(m).__name__ == "Gate" and not m.hash)
    x = torch.randn(3, model.cfg.dim, generator=rng)
    before = kernels.use(True)
    try:
        w, idx = gate(x, torch.zeros(3, dtype=torch.int64))
    finally:
        kernels.use(before)
    scores = torch.sqrt(torch.nn.functional.softplus(x @ gate.weight.float().t()))
    assert torch.equal(idx, (scores + gate.bias.float()).topk(gate.topk, dim=-1).indices)
