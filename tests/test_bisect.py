"""Bisection logic on the CPU: fake capture results drive the search, the leaves, the findings and
the report files; and `dsv4-audit bisect` without CUDA says so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from audit.capture.view import render_tree, write_outputs
from audit.capture.bisect import STEP, bisect, findings, inventory, parse_layers, summary_line
from audit.capture.trial import CaptureResult
from audit.errors import AuditError

REPO = Path(__file__).resolve().parent.parent
SRC = {"file": "/src/model.py", "line": 10, "function": "forward", "ranges": [["/src/model.py", 10, 20]]}


def tree_capture(spec: dict):
    """A fake `capture(path)`: spec[path] = dict(status=..., kids=[...], idle=[...], **result fields)."""
    calls = []

    def capture(path):
        path = path or STEP
        calls.append(path)
        s = dict(spec.get(path, {}))
        kids = [{"path": k, "type": "M", "called": True} for k in s.pop("kids", [])]
        kids += [{"path": k, "type": "M", "called": False} for k in s.pop("idle", [])]
        s.setdefault("status", "pass")
        s.setdefault("source", SRC)
        return CaptureResult(path=path, module_type="M", children=kids, **s)

    capture.calls = calls
    return capture


LAYERS = ["model.layers.0", "model.layers.1", "model.layers.2"]
SYNC = dict(status="fail", error_class="sync-during-capture", error="operation failed due to a previous error")


def leaves(report) -> list[str]:
    return sorted(n.path for n in report.leaves)


def test_sync_in_a_child_is_found_at_the_child_only():
    g = "model.layers.1.gate"
    cap = tree_capture({
        STEP: dict(SYNC, raised_in=g, kids=LAYERS),
        "model.layers.1": dict(SYNC, raised_in=g, kids=["model.layers.1.norm", "model.layers.1.mix", g]),
        g: dict(SYNC, raised_in=g, raised_at={"file": "/src/gate.py", "line": 7, "function": "forward",
                                             "code": "x.item()"}),
    })
    report = bisect(cap, LAYERS)
    assert leaves(report) == [g]
    # passing layers are not expanded: step + 3 layers + 3 children of layer 1
    assert cap.calls == [STEP] + LAYERS + ["model.layers.1.norm", "model.layers.1.mix", g]
    assert report.counts()["fail"] == 3 and report.counts()["pass"] == 4


def test_own_code_and_a_child_can_both_be_leaves():
    a, comp = "model.layers.0.attn", "model.layers.0.attn.compressor"
    unpinned = dict(status="fail", error_class="unpinned-copy")
    cap = tree_capture({
        STEP: dict(unpinned, raised_in=a, kids=LAYERS),
        "model.layers.0": dict(unpinned, raised_in=a, kids=[a]),
        a: dict(unpinned, raised_in=a, kids=[a + ".wq", comp]),   # raised before any child ran
        comp: dict(unpinned, raised_in=comp, kids=[comp + ".wkv"]),
    })
    assert leaves(bisect(cap, LAYERS)) == [a, comp]


def test_raised_inside_a_child_that_passes_alone_blames_the_parent():
    a = "model.layers.2.attn"
    cap = tree_capture({
        STEP: dict(SYNC, raised_in=a + ".inner", kids=LAYERS),
        "model.layers.2": dict(SYNC, raised_in=a + ".inner", kids=[a]),
        a: dict(SYNC, raised_in=a + ".inner", kids=[a + ".inner"]),   # inner only fails with attn's inputs
    })
    assert leaves(bisect(cap, LAYERS)) == [a]


def test_mismatch_and_missing_kernels_recurse_by_kind():
    w, s = "model.layers.1.writer", "model.layers.2.side"
    cap = tree_capture({
        STEP: dict(status="mismatch", first_diff="step 1: out[0]", max_abs_diff=0.5, kids=LAYERS),
        "model.layers.1": dict(status="mismatch", first_diff="step 1: out[0]", max_abs_diff=0.5,
                               kids=["model.layers.1.mix", w]),
        w: dict(status="mismatch", first_diff="step 1: state model.layers.1.writer.ring", max_abs_diff=0.5),
        "model.layers.2": dict(status="uncaptured", eager_kernels=5, graph_kernels=4, kids=[s]),
        s: dict(status="empty", eager_kernels=1, graph_kernels=0),
    })
    report = bisect(cap, LAYERS)
    # the step's mismatch is explained by layer 1; layer 2's missing kernel is a different kind,
    # found at its own leaf
    assert leaves(report) == [w, s]


def test_step_failing_outside_the_layers_is_its_own_leaf():
    cap = tree_capture({STEP: dict(SYNC, raised_in="model", raised_at={"file": "/src/model.py", "line": 3,
                                                                     "function": "check", "code": "int(t)"},
                                   kids=LAYERS)})
    report = bisect(cap, LAYERS)
    assert leaves(report) == [STEP]
    f = findings(report)[0]
    assert (f.category, f.file, f.line, f.function) == ("capture-failure", "/src/model.py", 3, "check")


def test_children_that_did_not_run_are_not_captured():
    cap = tree_capture({
        STEP: dict(SYNC, raised_in="model.layers.0.ffn", kids=LAYERS[:2], idle=LAYERS[2:]),
        "model.layers.0": dict(SYNC, raised_in="model.layers.0.ffn", kids=["model.layers.0.ffn"]),
        "model.layers.0.ffn": dict(SYNC, raised_in="model.layers.0.ffn", kids=["model.layers.0.ffn.experts.1"],
                                   idle=["model.layers.0.ffn.experts.0"]),
    })
    report = bisect(cap, LAYERS)
    assert "model.layers.2" not in cap.calls and "model.layers.0.ffn.experts.0" not in cap.calls
    assert report.root.children[2].status == "not-called"
    assert leaves(report) == ["model.layers.0.ffn"]


def test_recursion_stops_at_max_depth():
    deep = {STEP: dict(SYNC, kids=["a"])}
    path = "a"
    for _ in range(6):
        deep[path] = dict(SYNC, kids=[path + ".x"])
        path += ".x"
    report = bisect(tree_capture(deep), ["a"], max_depth=3)
    assert max(n.depth for n in report.root.walk()) == 3


def test_progress_callbacks_count_every_capture():
    seen, queued = [], [1]
    cap = tree_capture({STEP: dict(SYNC, kids=LAYERS), "model.layers.0": dict(SYNC, kids=["model.layers.0.a"])})
    report = bisect(cap, LAYERS, on_result=lambda n: seen.append(n.path), on_queue=lambda k: queued.append(k))
    assert len(seen) == report.captures == sum(queued) == len(cap.calls)


# ---------------------------------------------------------------------- findings and files
def _mixed_report():
    g, w = "model.layers.0.gate", "model.layers.1.writer"
    cap = tree_capture({
        STEP: dict(SYNC, raised_in=g, kids=LAYERS[:2], warnings=["capture stream is on cuda:0 but the captured "
                                                                 "work runs on cuda:1: ..."]),
        "model.layers.0": dict(SYNC, raised_in=g, kids=[g]),
        g: dict(SYNC, raised_in=g, raised_at={"file": "/src/gate.py", "line": 7, "function": "forward",
                                              "code": "s = h.amax().item()"}),
        "model.layers.1": dict(status="mismatch", first_diff="step 1: out[0]", max_abs_diff=2.0, kids=[w]),
        w: dict(status="mismatch", first_diff="step 1: out[0]", max_abs_diff=2.0,
                source={"file": "/src/ring.py", "line": 20, "function": "forward",
                        "ranges": [["/src/ring.py", 20, 30]]}),
    })
    return bisect(cap, LAYERS[:2])


def test_findings_name_category_severity_and_line():
    report = _mixed_report()
    by_cat = {f.category: f for f in findings(report)}
    assert set(by_cat) == {"capture-failure", "replay-mismatch", "cross-device"}
    cf = by_cat["capture-failure"]
    assert (cf.severity, cf.file, cf.line, cf.module, cf.op) == ("blocks-capture", "/src/gate.py", 7,
                                                                 "model.layers.0.gate", "sync-during-capture")
    assert "s = h.amax().item()" in cf.message and "device" in cf.fix.lower()
    rm = by_cat["replay-mismatch"]
    assert (rm.severity, rm.file, rm.line) == ("silent-corruption", "/src/ring.py", 20)
    assert rm.extra["first_diff"] == "step 1: out[0]" and rm.extra["max_abs_diff"] == 2.0


def test_scan_findings_point_a_leaf_at_the_hazard_line():
    """No traceback for a mismatch: the CPU scan's baked-host-value inside the module gives the line."""
    scan = [{"category": "host-sync", "file": "/src/ring.py", "line": 24, "module": "x", "op": "Tensor.item"},
            {"category": "baked-host-value", "file": "/src/ring.py", "line": 25, "function": "forward",
             "module": "model.layers.1.writer", "op": "aten.select"},
            {"category": "baked-host-value", "file": "/elsewhere.py", "line": 5, "module": "model.layers.9"}]
    rm = next(f for f in findings(_mixed_report(), scan) if f.category == "replay-mismatch")
    assert (rm.file, rm.line) == ("/src/ring.py", 25) and "CPU scan: baked-host-value" in rm.message
    assert rm.extra["defined_at"].endswith("ring.py:20")


def test_a_step_leaf_is_matched_to_the_scan_finding_at_the_line_it_raised():
    """The whole step fails outside any layer: of the scan's host-syncs, the one on the raising line
    explains it, not the first one in the inventory."""
    import random

    line = random.randint(30, 400)
    raised = {"file": os.path.join(os.getcwd(), "pkg", "model.py"), "line": line, "function": "check"}
    spec = {STEP: dict(SYNC, raised_at=raised, kids=LAYERS[:1]), LAYERS[0]: {}}
    report = bisect(tree_capture(spec), LAYERS[:1])
    scan = [{"category": "host-sync", "file": "pkg/moe.py", "line": 87, "module": "model.layers.0.ffn", "op": "aten.bincount"},
            {"category": "host-sync", "file": "pkg/model.py", "line": line, "module": "", "op": "Tensor.__int__"}]
    f = next(f for f in findings(report, scan) if f.module == STEP)
    assert (f.line, f.extra["scan_match"]) == (line, f"pkg/model.py:{line}") and "Tensor.__int__" in f.message


def test_inventory_files_and_tree_json(tmp_path):
    report = _mixed_report()
    inv = inventory(report)
    paths = write_outputs(report, inv, tmp_path / "out")
    names = sorted(p.name for p in paths)
    assert names == ["bisect.json", "inventory.csv", "inventory.json", "inventory.md", "inventory.sarif"]
    data = json.loads((tmp_path / "out" / "inventory.json").read_text())
    fields = {"category", "severity", "file", "line", "function", "module", "op", "count_per_step", "message", "fix"}
    assert data["findings"] and all(fields <= set(f) for f in data["findings"])
    assert data["summary"]["kind"] == "bisect" and "model.layers.0.gate" in data["summary"]["leaves"]
    tree = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert tree["tree"]["path"] == STEP and tree["tree"]["children"][0]["children"][0]["leaf"] is True


def test_rich_tree_and_summary():
    report = _mixed_report()
    console = Console(record=True, width=200)
    console.print(render_tree(report))
    text = console.export_text()
    for word in ("fail", "mismatch", "model.layers.0.gate", "◀ leaf", "/src/gate.py:7"):
        assert word in text
    line = summary_line(report)
    assert "failing leaves: model.layers.0.gate [fail: sync-during-capture]" in line


@pytest.mark.parametrize("spec,want", [(None, [0, 1, 2, 3]), ("0-2", [0, 1, 2]), ("3", [3]),
                                       ("0,2-3", [0, 2, 3]), ("all", [0, 1, 2, 3])])
def test_parse_layers(spec, want):
    assert parse_layers(spec, 4) == want


@pytest.mark.parametrize("spec", ["0-9", "x", "3-1", "-1"])
def test_parse_layers_rejects(spec):
    with pytest.raises(AuditError):
        parse_layers(spec, 4)


# ---------------------------------------------------------------------- the CLI without CUDA
def test_cli_bisect_without_cuda_is_one_line_and_exit_2():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "cli", "bisect", "--target", "dsv4:tiny"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    out = (p.stdout + p.stderr).strip()
    assert p.returncode == 2, out
    assert len(out.splitlines()) == 1 and "CUDA" in out and "dsv4-audit scan" in out


def test_run_bisect_end_to_end_with_a_fake_pool(monkeypatch, tmp_path):
    """The command's own path (progress bar, tree, summary, files) with a fake worker pool."""
    import audit.capture.view as V
    import audit.capture.pool as P

    g = "model.layers.1.gate"
    cap = tree_capture({STEP: dict(SYNC, raised_in=g, kids=LAYERS),
                        "model.layers.1": dict(SYNC, raised_in=g, kids=[g]),
                        g: dict(SYNC, raised_in=g, raised_at={"file": "/src/gate.py", "line": 7, "function": "f"})})

    class FakePool:
        spawned = 2

        def __init__(self, session, timeout):
            assert session["device"] == "cuda:0" and session["mode"] == "thread_local"

        def __enter__(self):
            return self

        def __exit__(self, *a):
            pass

        def start(self):
            return {"label": "fake", "name": "planted host:sync", "layers_root": "model.layers", "layers": LAYERS}

        capture = staticmethod(cap)

    monkeypatch.setattr(V, "require_cuda", lambda device: "cuda:0")
    monkeypatch.setattr(P, "CapturePool", FakePool)
    console = Console(record=True, width=200)
    report, inv = V.run_bisect("x.py:make", layers="1-2", out=tmp_path, mode="thread_local", console=console)
    assert cap.calls == [STEP, "model.layers.1", "model.layers.2", g]
    assert [f["module"] for f in inv.findings()] == [g]
    text = console.export_text()
    assert "bisecting 2" in text and "failing leaves: model.layers.1.gate" in text
    assert (tmp_path / "inventory.md").exists() and (tmp_path / "bisect.json").exists()
    assert report.meta["workers_started"] == 2 and report.meta["layers"] == LAYERS[1:]
    monkeypatch.chdir(tmp_path)  # no --out: reports/bisect-<target name>/, like scan's reports/scan-*/
    V.run_bisect("x.py:make", layers="1", mode="thread_local", console=console)
    assert (tmp_path / "reports" / "bisect-planted-host-sync" / "inventory.json").exists()


def test_bisect_json_names_source_files_relative_to_the_working_directory(tmp_path, monkeypatch):
    """An absolute path in a report names one machine; files inside the working directory are
    written relative to it wherever they appear (a node's file, its line ranges)."""
    import os

    from audit.capture.view import _relative

    src = tmp_path / "pkg" / "model.py"
    src.parent.mkdir()
    src.write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    line = int.from_bytes(os.urandom(2), "little") % 500 + 1
    tree = {"file": str(src), "ranges": [[str(src), line, line + 3]], "note": "/no/such/file.py",
            "children": [{"file": os.path.abspath("/etc/hostname")}]}
    out = _relative(tree)
    assert out["file"] == os.path.join("pkg", "model.py") and out["ranges"] == [[os.path.join("pkg", "model.py"), line,
                                                                                  line + 3]]
    assert out["note"] == "/no/such/file.py" and out["children"][0]["file"] == os.path.abspath("/etc/hostname")
