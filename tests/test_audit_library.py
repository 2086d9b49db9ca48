"""Stack attribution: a hazard inside code the target calls is found at the library's own line, with
the target's own line that led there as its caller.

tests/planted_site/plantedlib is a small package with planted hazards (`# HAZARD:` markers). It is
installed into a temporary site directory the way `pip install --target` would, with one extra
line on top of every file, so the line numbers that count are those of the installed copy, never
those of the repository's. tests/planted/library_frames.py calls into it (`# CALLS:` markers).
"""

from __future__ import annotations

import json
import re
import shutil
import site
import sys
from pathlib import Path

import pytest

import audit
from test_audit_planted import BLOCKING, markers

HERE = Path(__file__).parent
TARGET = HERE / "planted" / "library_frames.py"
PACKAGE = HERE / "planted_site" / "plantedlib"


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory):
    """plantedlib installed into a fresh site directory (shifted one line down), importable."""
    root = tmp_path_factory.mktemp("site")
    dest = root / "plantedlib"
    shutil.copytree(PACKAGE, dest)
    for f in dest.glob("*.py"):
        f.write_text("# installed copy: every line is one further down than in the repository\n" + f.read_text())
    before = list(sys.path)
    site.addsitedir(str(root))
    for name in [m for m in sys.modules if m == "plantedlib" or m.startswith("plantedlib.")]:
        del sys.modules[name]
    yield root
    sys.path[:] = before
    for name in [m for m in sys.modules if m == "plantedlib" or m.startswith("plantedlib.")]:
        del sys.modules[name]


def _library_markers(root: Path) -> set[tuple[str, int, str]]:
    return {(f"plantedlib/{f.name}", line, cat) for f in (root / "plantedlib").glob("*.py")
            for line, cat in markers(f)}


def _calls(path: Path) -> set[int]:
    return {n for n, t in enumerate(path.read_text().splitlines(), 1) if re.search(r"#\s*CALLS:\s*\w+\s*$", t)}


@pytest.fixture(scope="module")
def lib_inv(site_dir):
    return audit.scan(f"{TARGET}:make", device="cpu")


def test_library_hazards_are_found_at_the_installed_line(lib_inv, site_dir):
    df = lib_inv.df
    got = {(f, int(line), c) for f, line, c in zip(df.file, df.line, df.category)}
    expected = _library_markers(site_dir)
    assert expected - got == set(), f"missing (file, line, category): {sorted(expected - got)}"
    bad = df[df.severity.isin(BLOCKING)]
    extra = {(f, int(line), c) for f, line, c in zip(bad.file, bad.line, bad.category)} - expected
    assert not extra, f"blocking findings at unmarked lines: {sorted(extra)}"
    # the repository copy is one line up: no finding may point at it
    assert not df.file.astype(str).str.contains("planted_site").any()


def test_each_library_finding_names_the_targets_line_that_called(lib_inv):
    rel = str(TARGET.relative_to(Path.cwd())) if TARGET.is_relative_to(Path.cwd()) else str(TARGET)
    calls = _calls(TARGET)
    lib = lib_inv.df[lib_inv.df.file.str.startswith("plantedlib/")]
    assert len(lib) and set(lib.caller_file) == {rel}
    assert set(lib.caller_line.astype(int)) == calls
    assert set(lib.caller_function) == {"step"}
    # the cache's growth is reached from the `self.cache.append` line, the host read from `normalize`
    grow = lib[(lib.file == "plantedlib/kv.py") & (lib.category == "dynamic-shape")].iloc[0]
    assert "self.cache.append" in TARGET.read_text().splitlines()[int(grow.caller_line) - 1]


def test_markdown_csv_and_json_show_site_and_caller(lib_inv, tmp_path):
    from audit.report import writers

    paths = writers.write(lib_inv, tmp_path)
    md = paths["md"].read_text()
    row = next(l for l in md.splitlines() if "`plantedlib/numerics.py:" in l and "Tensor.item" in l)
    assert "(normalize) <- `" in row and "library_frames.py:" in row and "(step)" in row
    data = json.loads(paths["json"].read_text())
    f = next(x for x in data["findings"] if x["op"] == "Tensor.item")
    assert f["file"] == "plantedlib/numerics.py" and f["function"] == "normalize"
    assert f["caller_file"].endswith("library_frames.py") and f["caller_function"] == "step"
    header = paths["csv"].read_text().splitlines()[0].split(",")
    assert {"file", "line", "function", "caller_file", "caller_line", "caller_function"} <= set(header)


def test_one_finding_per_innermost_site(lib_inv):
    """Findings are grouped and de-duplicated by their innermost site: one row per (category, site, op)."""
    df = lib_inv.df
    assert not df.duplicated(["category", "file", "line", "op"]).any()


def test_clean_twin_calls_the_safe_api(site_dir):
    inv = audit.scan(f"{TARGET}:make_clean", device="cpu")
    assert inv.blocking().empty, inv.blocking()[["category", "file", "line", "message"]].to_string()


def test_installed_module_target_without_a_wrapper_file(site_dir):
    """`plantedlib.runner:make`: installed code is the target's own; site and caller coincide."""
    inv = audit.scan("plantedlib.runner:make", device="cpu")
    df = inv.df[inv.df.severity.isin(BLOCKING)]
    got = {(f, int(line), c) for f, line, c in zip(df.file, df.line, df.category)}
    numerics = (site_dir / "plantedlib" / "numerics.py").read_text().splitlines()
    end = next(n for n, t in enumerate(numerics, 1) if t.startswith("def normalize_on_device"))
    runner_hazards = {x for x in _library_markers(site_dir)  # GrowingCache.append and normalize(): what it calls
                      if x[0] == "plantedlib/kv.py" or (x[0] == "plantedlib/numerics.py" and x[1] < end)}
    assert runner_hazards <= got, sorted(runner_hazards - got)
    assert (df.file == df.caller_file).all() and (df.line == df.caller_line).all()
    assert inv.meta["name"] == "plantedlib.runner-make"


def test_a_library_line_counts_once_per_step(lib_inv):
    """A library line reached in every step counts once per step, like a line of the target."""
    row = lib_inv.where("host-sync", file="plantedlib/numerics.py").iloc[0]
    assert row.count_per_step == 1


def test_installed_library_globals_are_state(site_dir, monkeypatch):
    """With plantedlib in a real site-packages folder (not only on sys.path), a module global of the
    library that the step changes (serving.TIMINGS, appended to by the @timed wrapper) is still
    Python state a replay never updates: found at the library's line, with the target's caller."""
    from audit.scan.sources import user_code

    user_code._init()
    root = user_code.norm_dir(str(site_dir))
    monkeypatch.setattr(user_code, "_SITE", user_code._SITE + [root])
    monkeypatch.setattr(user_code, "_SKIP", user_code._SKIP + [root])
    assert not user_code.is_user_file(str(site_dir / "plantedlib" / "serving.py"))
    inv = audit.scan(f"{TARGET}:make", device="cpu")
    want = {(f, line, c) for f, line, c in _library_markers(site_dir) if f == "plantedlib/serving.py"}
    df = inv.df
    got = {(f, int(line), c) for f, line, c in zip(df.file, df.line, df.category)}
    assert want and want <= got, sorted(want - got)
    row = df[(df.file == "plantedlib/serving.py") & (df.category == "cpu-side-effect")].iloc[0]
    assert "self.mix(y)" in TARGET.read_text().splitlines()[int(row.caller_line) - 1]
