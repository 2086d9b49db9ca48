"""The house has one-way stairs: no import circle inside dsv4/ or audit/, and dsv4 never imports audit.

Every import counts, also those inside functions (a lazy import is still a dependency). A package's
own `__init__` is not an edge from its submodules (importing `a.b` runs `a/__init__` first anyway)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dsv4", "audit")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _target(name: str, mods: dict) -> str | None:
    """The project module an import of `name` loads (the longest known prefix)."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def _edges(mod: str, path: Path, mods: dict) -> set[str]:
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for n in names:
            t = _target(n, mods)
            if t and t != mod and not mod.startswith(t + "."):  # a parent package's __init__ is not an edge
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _edges(m, p, mods) for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_dsv4_never_imports_audit():
    bad = {m: sorted(t for t in ts if t.startswith("audit")) for m, ts in _graph().items() if m.startswith("dsv4")}
    assert {m: ts for m, ts in bad.items() if ts} == {}


def test_the_checker_sees_a_planted_circle(tmp_path):
    """The walk is not vacuous: two modules importing each other (one lazily) form a component."""
    g = _graph()
    g["dsv4.config"] = g["dsv4.config"] | {"dsv4.model"}
    assert any({"dsv4.config", "dsv4.model"} <= set(c) for c in _cycles(g))
    assert len(g) > 60 and all(isinstance(v, set) for v in g.values())


# ---------------------------------------------------------------------- the scan's route
def _module_of(filename: str) -> str | None:
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    parts = rel.with_suffix("").parts
    if parts[0] not in ("audit", "cli"):
        return None
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_a_plain_scan_walks_each_stage_once_in_order(tmp_path):
    """cli -> scan -> target -> tracer -> detectors -> inventory -> writers -> terminal, never ranks.

    The route is what the drivers (cli, audit.scan.command, audit.scan.run) call: each call from a
    driver into another audit module is a visit, unless that module is already running (the
    progress callback is a call back, not a visit). Each stage's visits form one run, in order."""
    import sys

    from typer.testing import CliRunner

    import audit.report.terminal  # noqa: F401 - imported up front: module bodies are not visits
    import audit.scan.command  # noqa: F401
    import cli
    from audit import detectors

    detectors._load()
    drivers = {"cli", "audit.scan.command", "audit.scan.run"}
    visits: list[str] = []
    stack: list[str | None] = []
    known: dict[str, str | None] = {}

    def prof(frame, event, arg):
        if event == "return":
            if stack:
                stack.pop()
            return
        if event != "call":
            return
        fn = frame.f_code.co_filename
        if fn not in known:
            known[fn] = _module_of(fn)
        mod = known[fn]
        caller = next((m for m in reversed(stack) if m is not None), None)
        if mod is not None and caller in drivers and mod != caller and mod not in stack:
            visits.append(mod)
        stack.append(mod)

    target = ROOT / "tests" / "planted" / "data_dependent_control.py"
    sys.setprofile(prof)
    try:
        res = CliRunner().invoke(cli.app, ["scan", "--target", f"{target}:make", "--device", "cpu",
                                           "--fail-on", "never", "--out", str(tmp_path / "inv")])
    finally:
        sys.setprofile(None)
    assert res.exit_code == 0, res.output
    assert not [m for m in visits if m.startswith("audit.ranks")]
    stages = ["audit.scan.command", "audit.scan.run", "audit.target", "audit.scan.tracer", "audit.detectors",
              "audit.report.inventory", "audit.report.writers", "audit.report.terminal"]
    seq = [s for m in visits for s in stages if m == s or m.startswith(s + ".")]
    runs = [s for i, s in enumerate(seq) if i == 0 or seq[i - 1] != s]
    assert runs == stages, " ".join(visits)
