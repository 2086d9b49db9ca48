"""Trial-capture machinery that runs without a GPU: error classification, state snapshots, static
inputs and bitwise comparison."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from audit.capture.state import RandomFeed, Snapshot, bits_equal, clone_tree, compare_trees, max_abs_diff
from capture_util import _user_level_failure
from audit.capture.trial import CaptureResult, check_stream_device, classify_error, error_text, raised_at

PLANTED = Path(__file__).parent / "planted_gpu"
sys.path.insert(0, str(PLANTED))

# ---------------------------------------------------------------------- classification
# Texts as torch 2.11 prints them (docs/hazards.md, measured on an H200), boilerplate included.
BOILER = ("\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
          "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
          "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
CASES = [
    ("CUDA error: operation failed due to a previous error during capture\nSearch for "
     "`cudaErrorStreamCaptureInvalidated' in https://docs.nvidia.com/cuda/..." + BOILER, "sync-during-capture"),
    ("CUDA error: operation not permitted when stream is capturing" + BOILER, "sync-during-capture"),
    ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned. "
     "Please pin the CPU tensor.", "unpinned-copy"),
    ("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cuda:1!",
     "cross-device"),
    ("CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`", "external-allocation"),
    ("CUDA driver error: cuMemAlloc failed: operation not permitted when stream is capturing",
     "external-allocation"),
    ("CUDA error: operation would make the legacy stream depend on a capturing blocking stream\nSearch for "
     "`cudaErrorStreamCaptureImplicit'" + BOILER, "illegal-op"),
    ("CUDA error: capture was not joined (cudaErrorStreamCaptureUnjoined)", "illegal-op"),
    ("CUDA error: an illegal memory access was encountered" + BOILER, "illegal-op"),
    ("something else entirely", "other"),
    ("Offset increment outside graph capture encountered unexpectedly.", "illegal-op"),
]


@pytest.mark.parametrize("text,cls", CASES)
def test_classify_error(text, cls):
    assert classify_error(text) == cls


def test_boilerplate_does_not_make_everything_illegal():
    assert classify_error("RuntimeError: weird" + BOILER) == "other"


def test_error_chain_text_and_raising_line():
    """capture_end's complaint replaces the body's error: both texts count, the body's line wins."""
    try:
        try:
            _user_level_failure()
        except RuntimeError:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
    except RuntimeError as e:
        exc = e
    text = error_text(exc)
    assert text.index("Cannot copy") < text.index("previous error")
    assert classify_error(text) == "unpinned-copy"
    at = raised_at(exc)
    assert at["function"] == "_user_level_failure"
    assert at["file"].endswith("capture_util.py") and "raise RuntimeError" in at["code"]


def test_result_roundtrip_and_describe():
    r = CaptureResult(path="a.b", status="mismatch", max_abs_diff=0.5, first_diff="step 1: out[0]")
    again = CaptureResult.from_dict(r.to_dict() | {"unknown": 1})
    assert again == r and again.failing and "step 1: out[0]" in again.describe()
    assert not CaptureResult(status="not-called").failing


def test_stream_device_check_names_both_devices():
    class FakeStream:
        device = torch.device("cuda", 0)

    msg = check_stream_device(FakeStream(), "cuda:1")
    assert "cuda:0" in msg and "cuda:1" in msg and "torch.cuda.Stream(device=" in msg
    assert check_stream_device(FakeStream(), "cuda:0") is None


def test_trial_without_cuda_is_an_error_result():
    from audit.capture.trial import trial_capture

    r = trial_capture(lambda: None, device="cpu")
    assert r.status == "error" and "CUDA" in r.error


# ---------------------------------------------------------------------- state
@dataclasses.dataclass
class Cache:
    kv: torch.Tensor
    n: int = 0


class Stateful(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("buf", torch.zeros(3, 4))
        self.cache = Cache(torch.zeros(2))
        self.pos = 0
        self.history: list = []
        self.gen = torch.Generator().manual_seed(1)

    def forward(self, x):
        self.buf[self.pos % 3] = self.lin(x)
        self.cache.kv += 1
        self.cache.n += 1
        self.pos += 1
        self.history.append(self.pos)
        return self.buf.sum(0) + torch.rand(1, generator=self.gen)


def test_snapshot_restores_in_place():
    m = Stateful()
    snap = Snapshot({"": m})
    buf_ptr, kv = m.buf.data_ptr(), m.cache.kv
    first = m(torch.ones(4))
    m(torch.ones(4))
    assert snap.changed().keys() == {"buf", "cache.kv"}
    snap.restore()
    assert m.pos == 0 and m.cache.n == 0 and m.history == [] and m.cache.kv is kv
    assert m.buf.data_ptr() == buf_ptr and not m.buf.any() and not m.cache.kv.any()
    assert torch.equal(m(torch.ones(4)), first)  # the generator was rewound too


def test_snapshot_skips_weights_and_weight_views():
    m = Stateful()
    m.bank = m.lin.weight.data[None]  # a stacked view of a parameter, like a MoE weight bank
    snap = Snapshot({"": m})
    paths = {p for p, _, _ in snap.tensors}
    assert "bank" not in paths and "lin.weight" not in paths and "buf" in paths


def test_compare_state_against_eager_record():
    m = Stateful()
    snap = Snapshot({"": m})
    m(torch.ones(4))
    record = snap.changed()
    snap.restore()
    m(torch.ones(4))
    assert snap.compare_state(record) is None
    m.buf[2] = 7.0
    d = snap.compare_state(record)
    assert d[1] == "state buf" and d[0] == pytest.approx(7.0, abs=10)


def test_clone_tree_keeps_aliasing_and_dataclasses():
    t = torch.arange(4.0)
    c = Cache(t)
    out = clone_tree((t, [t, c], {"k": t}))
    assert out[0] is out[1][0] is out[2]["k"] is out[1][1].kv
    assert out[0] is not t and torch.equal(out[0], t)


def test_random_feed_is_fresh_reproducible_and_in_range():
    x = torch.randn(8, 16) * 3 + 5
    mask = torch.zeros(4, 4).masked_fill(torch.eye(4, dtype=torch.bool), float("-inf"))
    ids = torch.tensor([3, 9, 1, 7])
    flags = torch.tensor([True, False])
    static = clone_tree(((x, mask, ids, flags), {}))
    feed = RandomFeed(static, seed=4)
    feed(0)
    a = [t.clone() for t in static[0]]
    feed(1)
    b = [t.clone() for t in static[0]]
    feed(0)
    assert all(torch.equal(p, q) for p, q in zip(a, static[0]))  # same k -> same values
    assert not torch.equal(a[0], x) and not torch.equal(a[0], b[0])
    assert torch.isinf(a[1]).equal(torch.isinf(mask))             # -inf pattern kept
    assert sorted(a[2].tolist()) == sorted(ids.tolist())          # ints: a permutation
    assert torch.equal(a[3], flags)
    assert abs(a[0].mean().item() - 5) < 1.5


def test_bitwise_comparison_semantics():
    nan = torch.tensor([float("nan"), 1.0])
    assert bits_equal(nan, nan.clone())                              # NaN == NaN bitwise
    assert not bits_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert max_abs_diff(torch.tensor([0.0]), torch.tensor([-0.0])) == 0.0
    assert max_abs_diff(nan, torch.tensor([1.0, 1.0])) == math.inf
    a = {"logits": torch.ones(3), "aux": [torch.zeros(2), None]}
    b = {"logits": torch.ones(3), "aux": [torch.tensor([0.0, 0.25]), None]}
    assert compare_trees(a, clone_tree(a)) is None
    assert compare_trees(a, b) == (0.25, "out['aux'][0]")
    assert compare_trees([torch.ones(2)], [torch.ones(2), 1])[1].startswith("out (length")
