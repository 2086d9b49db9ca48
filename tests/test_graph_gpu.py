"""CUDAGraphDecoder on a GPU: every mode replays bitwise what the eager static path computes."""

from __future__ import annotations

import time

import pytest
import torch

import dsv4
from dsv4.decode.graph import CUDAGraphDecoder
from dsv4.decode.verify import verify_replay

pytestmark = pytest.mark.gpu


def _seed(rng) -> int:
    return int(torch.randint(0, 2**31, (1,), generator=rng))


@pytest.mark.parametrize("mode", ["ab", "full"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_tiny_replay_bitwise(mode, dtype, rng):
    model = dsv4.load("tiny", device="cuda", dtype=dtype, seed=_seed(rng) % 1000)
    dec = CUDAGraphDecoder(model, mode=mode, batch_size=2)
    res = verify_replay(dec, steps=64, seed=_seed(rng))
    assert res.ok, res.first_mismatch


@pytest.mark.parametrize("mode", ["ab", "full"])
def test_two_segments_on_one_device(mode, rng):
    """devices=[0, 0]: the multi-device code path (per-segment graphs, copies between) on one GPU."""
    model = dsv4.load("tiny", device="cuda", dtype="bfloat16")
    dec = CUDAGraphDecoder(model, mode=mode, batch_size=1, devices=[0, 0])
    assert len(dec.segments) == 2
    res = verify_replay(dec, steps=64, seed=_seed(rng))
    assert res.ok, res.first_mismatch


@pytest.mark.parametrize("mode", ["ab", "full"])
def test_a_decoder_whose_caches_were_reallocated_refuses_to_replay(mode, rng):
    """A second decoder at another batch size reallocates the model's caches; the first decoder's graphs
    point at the old ones, so replaying them would run on memory the model no longer reads: it raises."""
    model = dsv4.load("tiny", device="cuda", dtype="bfloat16", seed=_seed(rng) % 1000)
    first = CUDAGraphDecoder(model, mode=mode, batch_size=1)
    first.prefill(torch.randint(0, model.cfg.vocab_size, (1, 4)))
    first.step()
    second = CUDAGraphDecoder(model, mode=mode, batch_size=3)
    for call in (first.step, lambda: first.prefill(torch.randint(0, model.cfg.vocab_size, (1, 4)))):
        with pytest.raises(dsv4.DSV4Error, match="reallocated"):
            call()
    assert verify_replay(second, steps=8, seed=_seed(rng)).ok  # the newest decoder is fine
    CUDAGraphDecoder(model, mode=mode, batch_size=3).step()  # same batch: the caches are reused, no error
    second.step()


def test_graph_matches_reference_path_float32(rng):
    """The full graph computes the reference function (float32, 1e-5), across block emissions."""
    model = dsv4.load("tiny", device="cuda", dtype="float32")
    ids = torch.randint(0, 1024, (1, 200), generator=rng).cuda()
    model.prefill(ids[:, :4])
    ref = [model.decode(ids[:, i]) for i in range(4, 200)]
    dec = CUDAGraphDecoder(model, mode="full")
    dec.prefill(ids[:, :4])
    for k, i in enumerate(range(4, 200)):
        out = dec.decode(ids[:, i].cpu())
        assert ((out - ref[k]).norm() / ref[k].norm()).item() <= 1e-5


@pytest.mark.parametrize("mode", ["eager", "ab", "full"])
def test_flash_h200_slice(mode, rng):
    """4 layers of flash-h200 geometry (ratios 0, 0, 4, 128): replay bitwise, report latency."""
    model = dsv4.load("flash-h200", device="cuda", dtype="bfloat16", n_layers=4, max_seq_len=1024)
    dec = CUDAGraphDecoder(model, mode=mode)
    if mode != "eager":
        res = verify_replay(dec, steps=64, seed=_seed(rng))
        assert res.ok, res.first_mismatch
    dec.prefill(torch.randint(0, model.cfg.vocab_size, (1, 16), generator=rng))
    ids = torch.randint(0, model.cfg.vocab_size, (1,), generator=rng)
    for _ in range(3):
        dec.decode(ids)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        dec.decode(ids)
    torch.cuda.synchronize()
    print(f"flash-h200 x4 layers {mode}: {(time.perf_counter() - t0) / 20 * 1e3:.2f} ms/token")
