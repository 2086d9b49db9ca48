"""CI exit codes (#17): scan/bisect --fail-on, report --baseline --fail-on-new, the inventory major version."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
from test_audit_cli import PLANTED, _one_error_line, _run  # the CLI runner and the one-line error check

from audit.report.inventory import Finding, Inventory


@pytest.mark.parametrize("target, fail_on, code", [
    ("host_sync.py:make", "blocks-capture", 1),       # blocks-capture findings
    ("host_sync.py:make", "never", 0),
    ("dynamic_shape.py:make", "blocks-capture", 0),   # only silent-corruption (and info) findings
    ("dynamic_shape.py:make", "silent-corruption", 1),
    ("dynamic_shape.py:make", "performance", 1),      # performance is below silent-corruption: still fails
    ("dynamic_shape.py:make_clean", "performance", 0),  # info findings never fail
    ("dynamic_shape.py:make", None, 1),               # default with --target: silent-corruption
    ("dynamic_shape.py:make_clean", None, 0),
])
def test_scan_fail_on(target, fail_on, code, tmp_path):
    args = ["scan", "--target", PLANTED / target, "--out", tmp_path / "o", "--steps", 3]
    res = _run(*args, *(["--fail-on", fail_on] if fail_on else []))
    assert res.exit_code == code, res.output
    assert (tmp_path / "o" / "inventory.sarif").is_file()  # written whatever the exit code
    if code:
        assert f"fail-on {fail_on or 'silent-corruption'}:" in res.stderr and "Traceback" not in res.output


def test_bare_scan_never_fails_on_findings(monkeypatch, tmp_path):
    """No --target: the embedded demo, full of findings by design, exits 0 unless --fail-on says otherwise."""
    from audit.scan import command

    def fake_scan(target, **kw):
        f = Finding("host-sync", "blocks-capture", "dsv4/model.py", 10, "forward", "m", "Tensor.item", 1.0, "sync")
        return Inventory.from_findings([f], {"target": target, "name": "tiny-reference", "findings": {}})

    monkeypatch.setattr(command, "scan", fake_scan)
    monkeypatch.chdir(tmp_path)
    assert _run("scan").exit_code == 0
    assert _run("scan", "--fail-on", "blocks-capture").exit_code == 1


def test_bisect_fail_on_exit_codes(monkeypatch, tmp_path):
    """The bisect command's exit code follows its inventory (the capture itself needs CUDA: faked here)."""
    from audit.capture import view

    found = {"rows": []}

    def fake_bisect(target, **kw):
        found["target"] = target
        return None, Inventory.from_findings(found["rows"], {"target": target})

    monkeypatch.setattr(view, "require_cuda", lambda device: "cuda:0")
    monkeypatch.setattr(view, "run_bisect", fake_bisect)
    assert _run("bisect").exit_code == 0 and found["target"] == "dsv4:tiny"
    found["rows"] = [Finding("uncaptured-kernel", "silent-corruption", "m.py", 3, "f", "layers.0", "k", 1.0, "x")]
    assert _run("bisect").exit_code == 0  # bare: never
    assert _run("bisect", "--target", "dsv4:tiny").exit_code == 1  # with a target: silent-corruption
    assert _run("bisect", "--fail-on", "blocks-capture").exit_code == 0
    found["rows"].append(Finding("capture-failure", "blocks-capture", "m.py", 9, "g", "layers.1", "", 1.0, "raised"))
    res = _run("bisect", "--fail-on", "blocks-capture")
    assert res.exit_code == 1 and "capture-failure at m.py:9" in res.stderr


@pytest.mark.parametrize("cmd", [["scan", "--target", PLANTED / "rng.py:make"], ["bisect"]])
def test_bad_fail_on_is_exit_2(cmd, tmp_path):
    _one_error_line(_run(*cmd, "--fail-on", "sometimes", "--out", tmp_path / "x"), "--fail-on must be one of")


def _shift(src: Path, dst: Path, n: int, extra: str = "") -> None:
    """dst = src with n comment lines inserted after the imports (above every finding), `extra` after `def step`."""
    lines = src.read_text().splitlines(keepends=True)
    at = max(i for i, ln in enumerate(lines) if ln.startswith("import ") or ln.startswith("from ")) + 1
    lines[at:at] = [f"# unrelated edit {k}\n" for k in range(n)]
    text = "".join(lines)
    if extra:
        head, sep, rest = text.partition("    def step(self):\n")
        body_indent = "        "
        text = head + sep + body_indent + extra + "\n" + rest
    dst.write_text(text)


def test_fail_on_new_is_robust_to_line_shifts(tmp_path):
    rnd = random.Random(int.from_bytes(os.urandom(4), "little"))
    work = tmp_path / "proj"
    work.mkdir()
    target = work / "decoder.py"
    shutil.copy(PLANTED / "host_sync.py", target)
    assert _run("scan", "--target", f"{target}:make", "--out", tmp_path / "base", "--fail-on", "never").exit_code == 0
    base = json.loads((tmp_path / "base" / "inventory.json").read_text())["findings"]
    assert any(f["category"] == "host-sync" for f in base)

    n = rnd.randint(3, 40)  # unrelated lines above every finding: all of them move
    _shift(PLANTED / "host_sync.py", target, n)
    assert _run("scan", "--target", f"{target}:make", "--out", tmp_path / "moved", "--fail-on", "never").exit_code == 0
    moved = json.loads((tmp_path / "moved" / "inventory.json").read_text())["findings"]
    lines = lambda fs: sorted(f["line"] for f in fs if f["category"] == "host-sync")
    assert lines(moved) == [ln + n for ln in lines(base)]
    res = _run("report", tmp_path / "moved" / "inventory.json", "--baseline", tmp_path / "base" / "inventory.json",
               "--fail-on-new", "--out", tmp_path / "diff.md")
    assert res.exit_code == 0, res.output
    assert "**0 new**" in (tmp_path / "diff.md").read_text()

    # a new hazard in the step (a host read the baseline does not have): exit 1, named on stderr
    _shift(PLANTED / "host_sync.py", target, n, extra="self.x.max().item()  # a new host read")
    assert _run("scan", "--target", f"{target}:make", "--out", tmp_path / "new", "--fail-on", "never").exit_code == 0
    res = _run("report", tmp_path / "new" / "inventory.json", "--baseline", tmp_path / "base" / "inventory.json",
               "--fail-on-new")
    assert res.exit_code == 1, res.output
    new_line = next(i for i, ln in enumerate(target.read_text().splitlines(), 1) if "a new host read" in ln)
    assert "fail-on-new: 1 finding(s) not in the baseline" in res.stderr
    assert f"host-sync at {target}:{new_line}" in res.stderr
    # without --fail-on-new the same diff is just a report
    assert _run("report", tmp_path / "new" / "inventory.json", "--baseline",
                tmp_path / "base" / "inventory.json").exit_code == 0


def test_fail_on_new_needs_a_baseline(tmp_path):
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps(Inventory.from_findings([]).to_json_dict()))
    _one_error_line(_run("report", inv, "--fail-on-new"), "--fail-on-new compares against a baseline")


@pytest.mark.parametrize("version, ok", [("1.0", True), ("1.7", True), (None, True), ("2.0", False), ("0.9", False)])
def test_report_checks_the_major_version(version, ok, tmp_path):
    f = Finding("rng", "info", "a.py", 3, "step", "", "aten.rand", 1.0, "random")
    data = Inventory.from_findings([f], {"target": "t"}).to_json_dict()
    if version is None:
        data.pop("schema_version")  # written before the field existed: read as 1.0
    else:
        data["schema_version"] = version
    p = tmp_path / "inventory.json"
    p.write_text(json.dumps(data))
    res = _run("report", p)
    if ok:
        assert res.exit_code == 0 and "a.py:3" in res.stdout, res.output
    else:
        _one_error_line(res, f"schema_version {version} is not supported")
        _one_error_line(_run("report", p, "--baseline", p), "not supported")
