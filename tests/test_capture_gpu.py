"""Trial capture and bisection on a real GPU: each planted hazard is found at its own leaf.

Run: pytest -q -m gpu tests/test_capture_gpu.py   (skipped without CUDA)

Failing captures run in worker subprocesses (a capture invalidated by a sync poisons its process);
only captures that succeed run in this process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from audit.capture.view import render_tree
from audit.capture.bisect import bisect, findings, parse_layers

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parent.parent
PLANTED = Path(__file__).parent / "planted_gpu"
sys.path.insert(0, str(PLANTED))


def marker(name: str) -> int:
    from planted_common import marker_line

    return marker_line(str(PLANTED / name))


def show(report) -> str:
    c = Console(record=True, width=220)
    c.print(render_tree(report))
    return c.export_text()


def run(target: str, layers: str | None = None, **session):
    """Bisects `target` through the real worker pool; returns the report."""
    from audit.capture.pool import CapturePool

    sess = {"target": target, "device": "cuda:0", **session}
    with CapturePool(sess, timeout=600) as pool:
        info = pool.start()
        chosen = [info["layers"][i] for i in parse_layers(layers, len(info["layers"]))]
        return bisect(pool.capture, chosen)


# ---------------------------------------------------------------------- in process (captures that succeed)
@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_clean_callable_passes_with_every_kernel_in_the_graph(mode):
    from audit.capture.trial import capture_callable

    x = torch.randn(256, 256, device="cuda")
    r = capture_callable(lambda a: torch.relu(a @ a) + 1, (x,), capture_error_mode=mode)
    assert r.status == "pass", r
    assert r.eager_kernels is not None and r.eager_kernels >= 3
    assert r.graph_kernels == r.eager_kernels and r.replay_steps == 3 and r.first_diff is None
    assert r.stream_device == "cuda:0" and not r.warnings


def test_python_counter_replays_the_captured_slot():
    from baked_pos import RingWriter

    from audit.capture.trial import capture_callable

    writer = RingWriter(64).cuda()
    pos_before = writer.pos
    r = capture_callable(writer, (torch.randn(2, 64, device="cuda"),))
    assert r.status == "mismatch", r
    assert r.first_diff.startswith("step 1") and r.max_abs_diff > 0
    assert writer.pos == pos_before + 2  # warmup moved it; every later phase was rolled back to there


def test_multi_step_state_is_compared_not_just_outputs():
    """A module that returns nothing but writes a wrong slot: the state comparison catches it."""
    from audit.capture.trial import capture_callable

    class Sink(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("log", torch.zeros(8, 4))
            self.i = 0

        def forward(self, x):
            self.log[self.i] = x
            self.i += 1

    r = capture_callable(Sink().cuda(), (torch.randn(4, device="cuda"),))
    assert r.status == "mismatch" and "state" in r.first_diff, r


# ---------------------------------------------------------------------- planted leaves (isolated)
FAILS = [
    ("host_sync.py:make", "model.layers.1.gate", "sync-during-capture"),
    ("unpinned_copy.py:make", "model.layers.1.bias", "unpinned-copy"),
]


@pytest.mark.parametrize("target,leaf,cls", FAILS)
def test_capture_failure_found_at_the_leaf_and_line(target, leaf, cls):
    report = run(f"{PLANTED / target}")
    text = show(report)
    assert [n.path for n in report.leaves] == [leaf], text
    node = report.leaves[0]
    assert node.result.status == "fail" and node.result.error_class == cls, text
    assert node.result.raised_in == leaf
    file = target.split(":")[0]
    want = marker(file)
    assert node.result.raised_at["file"].endswith(file) and node.result.raised_at["line"] == want, text
    assert report.root.result.status == "fail"  # the whole step fails too, explained by the leaf
    for layer in ("model.layers.0", "model.layers.2"):
        assert next(n for n in report.root.children if n.path == layer).status == "pass", text
    (f,) = findings(report)
    assert (f.category, f.severity, f.line, f.module) == ("capture-failure", "blocks-capture", want, leaf)


def test_baked_python_position_is_a_replay_mismatch_at_the_leaf():
    report = run(f"{PLANTED / 'baked_pos.py'}:make")
    text = show(report)
    assert [n.path for n in report.leaves] == ["model.layers.1.writer"], text
    r = report.leaves[0].result
    assert r.status == "mismatch" and r.first_diff.startswith("step 1"), text
    assert r.graph_kernels == r.eager_kernels, text
    (f,) = findings(report)
    assert f.category == "replay-mismatch" and f.file.endswith("baked_pos.py")


@pytest.mark.parametrize("backend,module", [("cute", "cutlass"), ("triton", "triton"), ("cupy", "cupy")])
def test_kernel_on_a_cached_stream_is_uncaptured_at_the_leaf(backend, module):
    pytest.importorskip(module)
    report = run(f"{PLANTED / 'uncaptured.py'}:make_{backend}")
    text = show(report)
    assert [n.path for n in report.leaves] == ["model.layers.1.side"], text
    r = report.leaves[0].result
    assert r.status in ("uncaptured", "empty") and r.graph_kernels < r.eager_kernels, text
    assert report.root.result.status in ("uncaptured", "empty"), text
    (f,) = findings(report)
    assert f.category == "uncaptured-kernel" and f.severity == "silent-corruption"


def test_stream_of_the_wrong_device():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    target = f"{PLANTED / 'wrong_device.py'}:make"
    good = run(target, layers="0-0", device="cuda:1")
    assert good.root.result.status == "pass" and not good.root.result.warnings, show(good)
    bad = run(target, layers="0-0", device="cuda:1", stream_device="cuda:0")
    r = bad.root.result
    assert r.status in ("empty", "uncaptured", "fail"), show(bad)
    assert any("capture stream is on cuda:0" in w for w in r.warnings)
    cats = {f.category for f in findings(bad)}
    assert "cross-device" in cats and cats & {"uncaptured-kernel", "capture-failure"}, show(bad)


# ---------------------------------------------------------------------- DeepSeek-V4
def test_reference_path_names_its_failing_leaves():
    report = run("dsv4:tiny", layers="0-1", path="reference")
    text = show(report)
    leaves = {n.path: n.result for n in report.leaves}
    assert report.root.result.status == "fail", text
    for i in (0, 1):
        attn, ffn = leaves.get(f"model.layers.{i}.attn"), leaves.get(f"model.layers.{i}.ffn")
        assert attn is not None and ffn is not None, text
        assert attn.error_class == "unpinned-copy" and attn.raised_at["file"].endswith("attention.py"), text
        # `.tolist()` of a CUDA tensor during capture is refused as a copy into pageable memory (H200,
        # torch 2.11) before it could sync; either class names the host read at its line in moe.py
        assert ffn.error_class in ("sync-during-capture", "unpinned-copy"), text
        assert ffn.raised_at["file"].endswith("moe.py"), text
    for n in report.root.walk():
        if n.leaf:
            assert n.result.status == "fail", text
    # layer 1 compresses (ratio 4): its compressor's own host copy is a leaf of its own
    assert "model.layers.1.attn.compressor" in leaves, text
    assert all(f.category == "capture-failure" and f.line > 0 for f in findings(report))


@pytest.mark.skipif(importlib.util.find_spec("dsv4.decode.static") is None, reason="no static decode path yet")
def test_static_path_passes_everywhere():
    report = run("dsv4:tiny", path="static")
    text = show(report)
    assert report.root.result.status == "pass", text
    assert not report.leaves and not [n for n in report.root.walk() if n.failing], text
    assert report.root.result.graph_kernels == report.root.result.eager_kernels, text


# ---------------------------------------------------------------------- the command
def test_cli_bisect_writes_the_inventory(tmp_path):
    out = tmp_path / "bisect"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "cli", "bisect", "--target", f"{PLANTED / 'host_sync.py'}:make",
                        "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    # the inventory is written, and an explicit target's blocking finding fails the run (--fail-on's default)
    assert p.returncode == 1 and "fail-on silent-corruption" in p.stderr + p.stdout, p.stdout + p.stderr
    data = json.loads((out / "inventory.json").read_text())
    (f,) = [f for f in data["findings"] if f["category"] == "capture-failure"]
    assert f["module"] == "model.layers.1.gate" and f["line"] == marker("host_sync.py")
    assert (out / "inventory.md").exists() and (out / "inventory.csv").exists() and (out / "bisect.json").exists()
    assert "model.layers.1.gate" in p.stdout
