"""Trial capture on the CPU: recording module calls, module naming, the worker and its pool."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from audit.capture.record import CallWatch, module_methods
from audit.capture.modules import all_modules, children_of, find_layers, resolve_module, source_info
from audit.errors import AuditError

PLANTED = Path(__file__).parent / "planted_gpu"
sys.path.insert(0, str(PLANTED))

# ---------------------------------------------------------------------- call recording
class Inner(nn.Module):
    def forward(self, x):
        return x * 2


class Attn(nn.Module):
    """Called through a method, not forward, like dsv4's attn.decode(x, pos)."""

    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.unused = Inner()

    def decode(self, x, pos: int):
        return self.project(x) + pos

    def project(self, x):
        return self.inner(x)

    def broken(self, x):
        return _explode(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn()

    def forward(self, x):
        y = self.attn.decode(x, 3)
        x.add_(1)  # mutates its input after the call: the record must be a clone
        return y


def test_callwatch_records_outermost_method_calls_with_cloned_args():
    blk = Block()
    mods = dict(blk.named_modules(prefix="blk"))
    x = torch.zeros(2)
    with CallWatch(mods, record=blk.attn) as w:
        blk(x)
    assert [c.method for c in w.calls] == ["decode"]            # not project(): it is nested
    args = w.calls[0].args
    assert torch.equal(args[0], torch.zeros(2)) and args[1] == 3
    assert w.ran(blk.attn.inner) and not w.ran(blk.attn.unused)
    assert not any(n in vars(blk.attn) for n in module_methods(blk.attn))  # unwrapped


def _explode(x):
    raise RuntimeError("boom")


def test_callwatch_names_the_innermost_module_that_raised():
    blk = Block()
    mods = dict(blk.named_modules(prefix="blk"))
    with CallWatch(mods) as w:
        with pytest.raises(RuntimeError) as own:
            blk.attn.broken(torch.zeros(1))              # raised by attn's own code (a plain helper)
        assert w.raised_in_chain(own.value) == "blk.attn"
        assert w.raised_in_chain(RuntimeError("other")) is None
    blk.attn.inner.forward = _explode                  # now raised inside the child
    with CallWatch(mods) as w:
        with pytest.raises(RuntimeError) as inner:
            blk(torch.zeros(1))
        assert w.raised_in_chain(inner.value) == "blk.attn.inner"
    assert blk.attn.inner.forward is _explode           # the user's own instance attribute is kept


def test_module_methods_are_the_users_own():
    names = module_methods(Attn())
    assert {"forward", "decode", "project"} <= set(names) and "to" not in names and "_apply" not in names


# ---------------------------------------------------------------------- module naming
class Wrapper(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.block = blocks


class Holder:
    """A static-path-like target: the model, plus a list of wrappers around the same blocks."""

    def __init__(self):
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(Block() for _ in range(3))
        self.model.small = nn.ModuleList([nn.Linear(1, 1)])
        self.dec = nn.Module()
        self.dec.layers = nn.ModuleList(Wrapper(b) for b in self.model.layers)


def test_module_paths_are_shortest_and_unique():
    h = Holder()
    mods = all_modules(h)
    assert mods["model.layers.1.attn"] is h.model.layers[1].attn
    assert "dec.layers.1.block" not in mods and "dec.layers.1" in mods
    assert resolve_module(h, "dec.layers.1.block.attn") is h.model.layers[1].attn
    with pytest.raises(AuditError, match="nothing named 'nope'"):
        resolve_module(h, "model.nope")


def test_find_layers_prefers_the_list_that_ran_then_the_richer_wrapper():
    h = Holder()
    assert find_layers(h)[0] == "dec.layers"            # same params, more submodules
    ran = {id(b) for b in h.model.layers}
    assert find_layers(h, called=ran) == ("model.layers", ["model.layers.0", "model.layers.1", "model.layers.2"])
    assert find_layers(h, root="model.layers.0") == ("model.layers.0", ["model.layers.0.attn"])


def test_children_look_through_module_lists():
    m = nn.Module()
    m.experts = nn.ModuleList(nn.Linear(1, 1) for _ in range(2))
    m.shared = nn.Linear(1, 1)
    assert [p for p, _ in children_of(m, "ffn")] == ["ffn.experts.0", "ffn.experts.1", "ffn.shared"]


def test_source_info_points_at_the_captured_method():
    info = source_info(Attn(), "decode")
    assert info["file"] == __file__ and info["function"] == "decode"
    assert open(__file__).read().splitlines()[info["line"] - 1].strip().startswith("def decode")
    assert any(a == __file__ and b <= info["line"] <= c for a, b, c in info["ranges"])


# ---------------------------------------------------------------------- the worker, on the CPU
def test_worker_records_and_reports_without_cuda():
    """Everything before the capture itself runs on the CPU: target, layers, recording, children."""
    from audit.capture.worker import Worker

    w = Worker({"target": f"{PLANTED / 'baked_pos.py'}:make", "device": "cpu", "target_warmup": 1})
    info = w.start()
    assert info["layers_root"] == "model.layers" and len(info["layers"]) == 3
    res = w.capture("model.layers.1")
    assert res.status == "error" and "CUDA" in res.error
    assert res.module_type == "Layer" and res.source["function"] == "forward"
    assert [c["path"] for c in res.children] == ["model.layers.1.norm", "model.layers.1.mix", "model.layers.1.writer"]
    assert all(c["called"] for c in res.children)
    writer = w.obj.model.layers[1].writer
    assert writer.pos == 1  # after the one target-warmup step; the recording steps were rolled back
    step = w.capture(None)
    assert step.path == "<step>" and [c["path"] for c in step.children] == info["layers"]
    assert w.capture("model.nothing").status == "error"


@pytest.mark.slow
def test_pool_protocol_and_respawn_on_cpu():
    """The subprocess path end to end: ready line, a result per request, a new worker after an error."""
    from audit.capture.pool import CapturePool

    with CapturePool({"target": f"{PLANTED / 'host_sync.py'}:make", "device": "cpu"}, timeout=300) as pool:
        info = pool.start()
        assert info["layers"][1] == "model.layers.1"
        r = pool.capture("model.layers.1.gate")
        assert r.status == "error" and r.module_type == "Gate"
        r2 = pool.capture(None)
        assert r2.status == "error" and pool.spawned == 2


def test_pool_reports_a_target_that_cannot_start(tmp_path):
    from audit.capture.pool import CapturePool

    bad = tmp_path / "bad.py"
    bad.write_text("def make(device):\n    raise ValueError('no such model')\n")
    with pytest.raises(AuditError, match="no such model"):
        with CapturePool({"target": f"{bad}:make", "device": "cpu"}, timeout=120) as pool:
            pool.start()


class Mid(nn.Module):
    def __init__(self):
        super().__init__()
        self.leaf = Inner()

    def forward(self, x):
        return x


class Outer(nn.Module):
    """Calls a grandchild directly, like dsv4's attention calling self.indexer.compressor.decode."""

    def __init__(self):
        super().__init__()
        self.mid = Mid()
        self.idle = Inner()

    def forward(self, x):
        return self.mid.leaf(x)


def test_children_include_grandchildren_called_directly():
    from audit.capture.worker import _children

    o = Outer()
    with CallWatch(dict(o.named_modules(prefix="o")), record=o) as w:
        o(torch.ones(1))
    kids = _children(o, "o", w)
    assert [(k["path"], k["called"]) for k in kids] == [("o.mid", False), ("o.idle", False), ("o.mid.leaf", True)]
    assert kids[-1]["direct_call"] is True


@pytest.mark.slow
def test_a_spare_worker_takes_over_after_a_failure(monkeypatch):
    """Where a second copy fits, the next worker is built while the current one answers: after an
    error the spare (already past its ready line) serves the next request."""
    import time

    from audit.capture import pool as P

    assert not P._room_for_another({}) and not P._room_for_another({"gpu_reserved": 40, "gpu_free": 100})
    assert P._room_for_another({"gpu_reserved": 30, "gpu_free": 100})
    monkeypatch.setattr(P, "_room_for_another", lambda info: True)
    with P.CapturePool({"target": f"{PLANTED / 'host_sync.py'}:make", "device": "cpu"}, timeout=300) as pool:
        pool.start()
        spare = pool._spare[0]
        assert pool.spawned == 2 and spare.poll() is None
        assert pool.capture("model.layers.1.gate").status == "error"
        time.sleep(0.1)
        r2 = pool.capture(None)
        # the spare answered (and, failing too, was closed); a new spare stands by
        assert r2.path == "<step>" and spare.poll() is not None and pool.spawned == 3
        last = pool._spare[0]
        assert last.poll() is None
    assert last.poll() is not None  # nothing left running
