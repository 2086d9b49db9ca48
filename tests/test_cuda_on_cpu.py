"""CUDA-only code scanned on a CPU (issue 14, point 4): waits and queries inside step(), warmup
included, are recorded as host-sync instead of raising; a target that needs CUDA to be built gets
one line. Runs on a machine without CUDA (that is the point); skipped where CUDA exists."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import audit
from cli import app

PLANTED = Path(__file__).parent / "planted_gpu"
sys.path.insert(0, str(PLANTED))
from markers import found, markers  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only stand-ins")
WAITS = PLANTED / "cuda_waits.py"


def _originals():
    c = torch.cuda
    return (c.synchronize, c.current_stream, c.default_stream, c.set_stream, vars(c.Stream)["__new__"],
            vars(c.Event)["__new__"], c.StreamContext.__enter__, c.StreamContext.__exit__, c.Event.synchronize,
            c.Stream.query)


def test_every_wait_is_found_at_its_line_with_warmup():
    before = _originals()
    inv = audit.scan(f"{WAITS}:make", device="cpu", steps=3, warmup=2)
    assert inv.meta["error"] is None and inv.meta["audited_steps"] == 3
    assert found(inv, WAITS) == markers(WAITS)
    ops = set(inv.where("host-sync").op)
    assert ops == {"torch.cuda.synchronize", "Stream.synchronize", "Event.synchronize", "Event.query", "Stream.query"}
    assert (inv.where("host-sync").count_per_step == 1).all()
    assert _originals() == before  # every stand-in removed
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.synchronize()


@pytest.mark.parametrize("factory", ["make_clean", "make_first_call_only"])
def test_device_side_waits_and_first_call_syncs_give_no_finding(factory):
    inv = audit.scan(f"{WAITS}:{factory}", device="cpu")
    assert inv.meta["error"] is None and inv.blocking().empty, inv.df[["line", "category", "op"]].to_string()


def test_a_failing_step_still_restores_torch(tmp_path):
    (tmp_path / "dies.py").write_text(
        "import torch\n\nclass T:\n    def prepare(self, i):\n        pass\n\n    def step(self):\n"
        "        torch.cuda.current_stream().synchronize()\n        raise ValueError('boom')\n\n"
        "def make(device):\n    return T()\n")
    before = _originals()
    with pytest.raises(audit.errors.TargetFailed, match="boom"):
        audit.scan(f"{tmp_path / 'dies.py'}:make", device="cpu", warmup=0)
    assert _originals() == before


def test_a_target_that_needs_cuda_to_be_built_gets_one_line(tmp_path):
    res = CliRunner().invoke(app, ["scan", "--target", f"{WAITS}:make_needs_gpu", "--device", "cpu",
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "scan it on a machine with a GPU" in err and "Traceback" not in res.output
    assert "cuda_waits.py:" in err  # the line that needed CUDA


def test_other_factory_errors_are_not_sent_to_a_gpu(tmp_path):
    (tmp_path / "bad.py").write_text("def make(device):\n    raise KeyError('no such layer')\n")
    with pytest.raises(audit.AuditError) as e:
        audit.scan(f"{tmp_path / 'bad.py'}:make", device="cpu")
    assert "GPU" not in str(e.value) and "no such layer" in str(e.value)


SIDE = """
import torch

class Side:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g, device=device)
        self.x = torch.zeros(2, {d}, device=device)
        self.side = torch.cuda.Stream()  # made at build time, as overlapped decoders do
        self.done = torch.cuda.Event()

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}))

    def step(self):
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            y = torch.tanh(self.x @ self.w)
            self.done.record()
        {join}
        return y

def make(device):
    return Side(device)
"""


@pytest.mark.parametrize("join", ["self.done.wait(torch.cuda.current_stream())", "pass"])
def test_streams_and_events_made_in_make_scan_on_a_cpu_only_torch(tmp_path, join):
    """A CPU-only torch may refuse torch.cuda.Stream() / Event() outside a step; the scan builds the target with
    the steps' stand-ins instead of sending it to a GPU, and the stream rule still sees a missing join."""
    import random

    (tmp_path / "side.py").write_text(SIDE.format(seed=random.randrange(2**31), d=random.choice([4, 8]), join=join))
    inv = audit.scan(f"{tmp_path / 'side.py'}:make", device="cpu")
    bad = inv.blocking()
    assert set(bad.category) == (set() if join != "pass" else {"unjoined-stream"}), bad[["category", "line"]]


@pytest.mark.parametrize("message", ["CUDA error: no CUDA-capable device is detected",
                                     "Found no NVIDIA driver on your system."])
def test_a_cuda_build_without_a_gpu_gets_the_stand_ins_too(tmp_path, monkeypatch, message):
    """A CUDA build of torch on a node without a GPU (or with CUDA_VISIBLE_DEVICES="") raises its own errors when
    make() builds a stream or an event; those are the missing GPU too, not a fault of the target."""
    import random

    def refuse(cls, *args, **kwargs):
        raise torch.AcceleratorError(message)

    monkeypatch.setattr(torch.cuda.Stream, "__new__", refuse)
    monkeypatch.setattr(torch.cuda.Event, "__new__", refuse)
    (tmp_path / "side.py").write_text(SIDE.format(seed=random.randrange(2**31), d=random.choice([4, 8]), join="pass"))
    inv = audit.scan(f"{tmp_path / 'side.py'}:make", device="cpu")
    assert set(inv.blocking().category) == {"unjoined-stream"}
