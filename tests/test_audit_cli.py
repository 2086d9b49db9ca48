"""`dsv4-audit scan` and `dsv4-audit report` end to end: files, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app

PLANTED = Path(__file__).parent / "planted"
runner = CliRunner()


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _one_error_line(res, text):
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.startswith("error:") and text in err and len(err.splitlines()) == 1, err
    assert "Traceback" not in res.output


def test_scan_writes_the_inventory(tmp_path):
    out = tmp_path / "inv"
    res = _run("scan", "--target", f"{PLANTED}/data_dependent_control.py:make", "--out", out, "--steps", 4)
    assert res.exit_code == 1, res.output  # not graph-ready: with --target, --fail-on defaults to silent-corruption
    assert "not graph-ready" in res.stdout and "ops/s" in res.stdout and "data-dependent-control" in res.stdout
    data = json.loads((out / "inventory.json").read_text())
    assert data["summary"]["audited_steps"] == 4 and data["summary"]["ops_per_second"] > 0
    assert {f["category"] for f in data["findings"]} >= {"data-dependent-control", "host-sync", "cpu-side-effect"}
    assert "## data-dependent-control" in (out / "inventory.md").read_text()
    assert (out / "inventory.csv").read_text().startswith("category,severity,file,line,function,module,op")
    # report of the same file, and a diff against itself: nothing fixed, nothing new
    rep = _run("report", out / "inventory.json")
    assert rep.exit_code == 0 and "# CUDA-graph readiness inventory" in rep.stdout
    diff = _run("report", out / "inventory.json", "--baseline", out / "inventory.json", "--out", tmp_path / "d.md")
    assert diff.exit_code == 0, diff.output
    text = (tmp_path / "d.md").read_text()
    assert "**0 fixed**" in text and "**0 new**" in text


def test_clean_target_is_graph_ready(tmp_path):
    res = _run("scan", "--target", f"{PLANTED}/rng.py:make_clean", "--out", tmp_path / "c", "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert "graph-ready" in res.stdout and "not graph-ready" not in res.stdout


@pytest.mark.parametrize("args, text", [
    (["--target", "missing/file.py:make"], "no such file"),
    (["--target", f"{PLANTED}/rng.py:nope"], "has no factory 'nope'"),
    (["--target", "justaname"], "expected FILE.py:FACTORY"),
    (["--target", "dsv4:giant"], "unknown preset"),
    (["--target", f"{PLANTED}/rng.py:make", "--steps", "1"], "--steps must be"),
    (["--target", f"{PLANTED}/rng.py:make", "--path", "turbo"], "--path must be"),
    (["--target", f"{PLANTED}/rng.py:make", "--device", "npu"], "--device"),
])
def test_bad_input_is_one_line_exit_2(args, text, tmp_path):
    _one_error_line(_run("scan", *args, "--out", tmp_path / "x"), text)


def test_factory_raising_or_wrong_protocol(tmp_path):
    f = tmp_path / "targets.py"
    f.write_text("def raises(device):\n    raise RuntimeError('no weights here')\n\n"
                 "class Half:\n    def step(self):\n        pass\n\ndef half(device):\n    return Half()\n")
    _one_error_line(_run("scan", "--target", f"{f}:raises", "--out", tmp_path / "x"), "no weights here")
    _one_error_line(_run("scan", "--target", f"{f}:half", "--out", tmp_path / "x"), "without prepare()")


def test_target_raising_mid_step_writes_partial_inventory(tmp_path):
    f = tmp_path / "flaky.py"
    f.write_text("import torch\n\nclass T:\n    x = torch.ones(3)\n    def prepare(self, i):\n        self.i = i\n"
                 "    def step(self):\n        x = self.x * 1.0\n        v = x.sum().item()\n"
                 "        if self.i == 4:\n            raise ValueError('bad token')\n        return v\n\n"
                 "def make(device):\n    return T()\n")
    out = tmp_path / "partial"
    res = _run("scan", "--target", f"{f}:make", "--device", "cpu", "--out", out)  # a GPU scan: x.sum() is a host sum
    assert res.exit_code == 1, res.output
    assert "bad token" in res.stderr and "flaky.py:11" in res.stderr and "Traceback" not in res.output
    data = json.loads((out / "inventory.json").read_text())
    assert data["summary"]["audited_steps"] == 2 and "bad token" in data["summary"]["error"]
    assert any(x["category"] == "host-sync" and x["line"] == 9 for x in data["findings"])
    assert "Partial inventory" in (out / "inventory.md").read_text()
    assert "scan stopped, no verdict" in res.stdout and "graph-ready:" not in res.stdout


def test_target_raising_in_its_first_step_gets_no_verdict(tmp_path):
    """Nothing ran, so nothing was found: that is no evidence that the step is graph-ready."""
    f = tmp_path / "broken.py"
    f.write_text("class T:\n    def prepare(self, i):\n        pass\n    def step(self):\n"
                 "        raise RuntimeError('size mismatch')\n\ndef make(device):\n    return T()\n")
    res = _run("scan", "--target", f"{f}:make", "--out", tmp_path / "out")
    assert res.exit_code == 1 and "size mismatch" in res.stderr
    assert "scan stopped, no verdict" in res.stdout
    assert "graph-ready:" not in res.stdout and "no findings" not in res.stdout


def test_report_bad_input(tmp_path):
    _one_error_line(_run("report", tmp_path / "none.json"), "no such file")
    (tmp_path / "bad.json").write_text("{")
    _one_error_line(_run("report", tmp_path / "bad.json"), "not valid JSON")


def test_default_scan_is_tiny_reference(monkeypatch, tmp_path):
    from audit.scan import command
    from audit.report.inventory import Inventory

    seen = {}

    def fake_scan(target, **kw):
        seen.update(kw, target=target)
        return Inventory.from_findings([], {"target": target, "name": "tiny-reference", "findings": {}})

    monkeypatch.setattr(command, "scan", fake_scan)
    monkeypatch.chdir(tmp_path)
    res = _run("scan")
    assert res.exit_code == 0, res.output
    assert seen["target"] == "dsv4:tiny" and seen["path"] == "reference" and seen["steps"] == 4
    assert (tmp_path / "reports" / "scan-tiny-reference" / "inventory.json").is_file()
