"""The graph-ready static path computes the reference function with fixed shapes only."""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.decode.graph import CUDAGraphDecoder
from dsv4.decode.static import StaticDecoder
from dsv4.decode.verify import verify_replay
from dsv4.errors import DSV4Error


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.slow
def test_static_equals_reference_over_a_ratio_128_block(rng):
    """150 steps from position 6: crosses the first ratio-128 block (m=128) and decodes 28 steps past it, the
    window wraps (W=16) nine times, 37 ratio-4 emissions; batch 2."""
    model = dsv4.load("tiny", dtype="float32", seed=int(torch.randint(0, 1000, (1,), generator=rng)))
    n = 156
    ids = torch.randint(0, model.cfg.vocab_size, (2, n), generator=rng)
    model.prefill(ids[:, :6])
    ref = [model.decode(ids[:, i]) for i in range(6, n)]
    model.reset()
    dec = StaticDecoder(model, batch_size=2)
    dec.prefill(ids[:, :6])
    worst = max(rel(dec.decode(ids[:, i]), ref[k]) for k, i in enumerate(range(6, n)))
    assert worst <= 1e-5, worst


def test_static_step_shapes_do_not_depend_on_position(rng):
    """The same ops on the same shapes at every step: record (op, shapes) of two steps and compare."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Shapes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.log = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.log.append((str(func), tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))))
            return func(*args, **(kwargs or {}))

    model = dsv4.load("tiny", dtype="bfloat16")
    dec = StaticDecoder(model, batch_size=1)
    dec.prefill(torch.randint(0, 1024, (1, 3), generator=rng))
    logs = []
    for step in range(130):  # steps 3 and 127 differ in every branch the reference takes
        dec.stage(torch.randint(0, 1024, (1,), generator=rng))
        if step in (0, 124):
            with Shapes() as mode:
                dec.step()
            logs.append(mode.log)
        else:
            dec.step()
    assert logs[0] == logs[1]


def test_static_decoder_bad_input(rng):
    model = dsv4.load("tiny", dtype="float32", max_seq_len=8)
    dec = StaticDecoder(model, batch_size=1)
    with pytest.raises(DSV4Error, match="before prefill"):
        dec.stage(torch.tensor([1]))
    dec.prefill(torch.randint(0, 1024, (1, 7), generator=rng))
    with pytest.raises(DSV4Error, match="batch-size"):
        dec.stage(torch.tensor([1, 2]))
    dec.decode(torch.tensor([3]))
    with pytest.raises(DSV4Error, match="max_seq_len"):
        dec.stage(torch.tensor([4]))


def test_graph_modes_need_cuda_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    model = dsv4.load("tiny", dtype="float32")
    for mode in ("ab", "full"):
        with pytest.raises(DSV4Error, match="needs CUDA"):
            CUDAGraphDecoder(model, mode=mode)


def test_eager_graph_decoder_matches_static_bitwise(rng):
    model = dsv4.load("tiny", dtype="bfloat16")
    dec = CUDAGraphDecoder(model, mode="eager", batch_size=2)
    res = verify_replay(dec, steps=6, seed=int(torch.randint(0, 2**31, (1,), generator=rng)))
    assert res.ok and res.steps == 6


def test_cache_generation_counts_replacements_only(rng):
    """allocate_caches reuses caches that match and bumps cache_generation when it replaces one: what a
    captured graph decoder checks before each replay."""
    model = dsv4.load("tiny", seed=int(torch.randint(0, 1000, (1,), generator=rng)))
    model.allocate_caches(2)
    g = model.cache_generation
    kept = [id(t) for t in model.cache_tensors()]
    model.allocate_caches(2)
    assert model.cache_generation == g and [id(t) for t in model.cache_tensors()] == kept
    model.allocate_caches(3)
    assert model.cache_generation > g and model.layers[0].attn.cache.batch == 3
