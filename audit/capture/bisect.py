"""Per-layer capture bisection: which module breaks capture or replays wrong, down to the leaf.

A capture error names no op, and a missing kernel or a wrong replay raises nothing at all. So we
capture the whole step, then each layer, and for every layer that fails, replays wrong or misses
kernels we capture each of its children that ran, recursively, down to the smallest module that
still fails on its own. Each capture is a separate trial in a disposable worker (`capture` below
is `CapturePool.capture` in real use, a fake in the CPU tests).

A failing node is a LEAF when its failure is not explained by a failing child: no child fails the
same way, or the capture error was raised in the node's own code (`raised_in`), outside any
child. Leaves become inventory findings (capture-failure, uncaptured-kernel, replay-mismatch) at
the line that raised, else at the matching CPU-scan finding inside the module, else at the
module's method definition.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

from audit.capture.trial import STATUSES, CaptureResult
from audit.errors import AuditError
from audit.report.inventory import CATEGORIES, Finding, Inventory

__all__ = ["Node", "BisectReport", "bisect", "parse_layers", "findings", "inventory", "load_scan", "summary_line",
           "explained", "mark_leaves", "STEP"]

STEP = "<step>"
CATEGORY = {"fail": "capture-failure", "empty": "uncaptured-kernel", "uncaptured": "uncaptured-kernel",
            "mismatch": "replay-mismatch"}
# The CPU-scan categories that usually cause each kind of capture failure.
SCAN_MATCH = {
    "sync-during-capture": ("host-sync",),
    "unpinned-copy": ("pageable-copy", "host-sync"),
    "cross-device": ("cross-device",),
    "external-allocation": ("lazy-init", "step-allocation"),
    "illegal-op": ("rng", "lazy-init", "host-sync"),
    "other": ("host-sync", "pageable-copy", "lazy-init"),
    "mismatch": ("baked-host-value", "stale-input-pointer", "cpu-side-effect", "data-dependent-control",
                 "dynamic-shape", "rng", "step-allocation"),
    "uncaptured": ("unjoined-stream", "cross-device"),
}
FIX = {
    "sync-during-capture": CATEGORIES["host-sync"].fix,
    "unpinned-copy": CATEGORIES["pageable-copy"].fix,
    "cross-device": CATEGORIES["cross-device"].fix,
    "external-allocation": CATEGORIES["lazy-init"].fix,
}

Capture = Callable[[str | None], CaptureResult]


@dataclass
class Node:
    path: str
    depth: int = 0
    result: CaptureResult | None = None
    children: list["Node"] = field(default_factory=list)
    leaf: bool = False

    @property
    def status(self) -> str:
        return self.result.status if self.result else "pending"

    @property
    def failing(self) -> bool:
        return bool(self.result and self.result.failing)

    def walk(self) -> Iterator["Node"]:
        yield self
        for c in self.children:
            yield from c.walk()


@dataclass
class BisectReport:
    root: Node
    layers_root: str = ""
    captures: int = 0
    seconds: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def leaves(self) -> list[Node]:
        return [n for n in self.root.walk() if n.leaf]

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in STATUSES}
        for n in self.root.walk():
            if n.result:
                out[n.status] += 1
        return out

    def to_dict(self) -> dict:
        def node(n: Node) -> dict:
            return {"path": n.path, "leaf": n.leaf, "result": n.result.to_dict() if n.result else None,
                    "children": [node(c) for c in n.children]}

        return {"meta": self.meta, "layers_root": self.layers_root, "captures": self.captures,
                "seconds": round(self.seconds, 3), "counts": self.counts(), "tree": node(self.root)}


# ---------------------------------------------------------------------- layer selection
def parse_layers(spec: str | None, n: int) -> list[int]:
    """'0-3', '2', '0,2,5-6' (inclusive ranges) -> sorted layer indices; None -> all n."""
    if spec is None or str(spec).strip() in ("", "all"):
        return list(range(n))
    out: set[int] = set()
    for part in str(spec).split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                a, b = part.split("-", 1) if not part.startswith("-") else (part, "")
                lo, hi = int(a), int(b)
            else:
                lo = hi = int(part)
        except ValueError:
            raise AuditError(f"--layers {spec!r}: expected ranges like 0-3 or 0,2,5-6") from None
        if lo > hi:
            raise AuditError(f"--layers {spec!r}: range {part} is backwards")
        if lo < 0 or hi >= n:
            raise AuditError(f"--layers {spec!r}: the target has {n} layers (0-{n - 1})")
        out.update(range(lo, hi + 1))
    return sorted(out)


# ---------------------------------------------------------------------- the search
def bisect(capture: Capture, layers: list[str], *, max_depth: int = 8,
           on_result: Callable[[Node], None] | None = None,
           on_queue: Callable[[int], None] | None = None) -> BisectReport:
    """Captures the step, then each layer; recurses into the children (that ran) of failing nodes."""
    t0 = time.perf_counter()
    report = BisectReport(Node(STEP))
    note = on_result or (lambda n: None)
    grow = on_queue or (lambda k: None)

    def run(node: Node) -> None:
        node.result = capture(None if node.path == STEP else node.path)
        report.captures += 1
        note(node)

    run(report.root)
    ran = {c["path"]: c.get("called", True) for c in report.root.result.children}
    queue: deque[Node] = deque()
    for path in layers:
        node = Node(path, depth=1)
        report.root.children.append(node)
        if ran.get(path, True):
            queue.append(node)
        else:
            node.result = CaptureResult(path=path, status="not-called")
    grow(len(queue))
    while queue:
        node = queue.popleft()
        run(node)
        if node.failing and node.depth < max_depth:
            kids = [c["path"] for c in node.result.children if c.get("called")]
            for path in kids:
                child = Node(path, depth=node.depth + 1)
                node.children.append(child)
                queue.append(child)
            grow(len(kids))
    mark_leaves(report.root)
    report.seconds = time.perf_counter() - t0
    return report


def _kind(r: CaptureResult) -> tuple:
    if r.status == "fail":
        return ("fail", r.error_class)
    return ("uncaptured",) if r.status in ("empty", "uncaptured") else (r.status,)


def _within(path: str | None, root: str) -> bool:
    return bool(path) and (path == root or path.startswith(root + "."))


def explained(node: Node) -> bool:
    """Does a failing child account for this node's failure?

    A capture error raised while a child ran is that child's (if the child fails alone too);
    raised in the node's own code it is the node's. Without that information, a failing child
    of the same kind explains it.
    """
    r = node.result
    bad = [c for c in node.children if c.failing]
    if r.status == "fail" and r.raised_in:
        return any(_within(r.raised_in, c.path) for c in bad)
    return any(_kind(c.result) == _kind(r) for c in bad)


def mark_leaves(node: Node) -> None:
    for c in node.children:
        mark_leaves(c)
    node.leaf = node.failing and not explained(node)


# ---------------------------------------------------------------------- findings
def rel_path(path: str | None) -> str:
    if not path:
        return "?"
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _in_ranges(file: str, line: int, ranges: list) -> bool:
    f = os.path.realpath(file) if file else ""
    return any(os.path.realpath(a) == f and b <= line <= c for a, b, c in ranges)


def _same_site(finding: dict, site: dict) -> bool:
    """A scan finding (path relative to where the scan ran, or absolute) at the line a capture raised."""
    f, g = str(finding.get("file") or ""), str(site.get("file") or "")
    if not f or not g or int(finding.get("line") or 0) != int(site.get("line") or -1):
        return False
    return os.path.realpath(f) == os.path.realpath(g) or g.endswith(os.sep + f)


def scan_match(node: Node, scan: list[dict]) -> dict | None:
    """The CPU-scan finding that explains this failure: one of the failure's kind at the very line
    the capture raised, else the first of that kind inside this module."""
    r = node.result
    key = r.error_class if r.status == "fail" else ("mismatch" if r.status == "mismatch" else "uncaptured")
    cats = SCAN_MATCH.get(key or "other", ())
    ranges = (r.source or {}).get("ranges", [])
    inside = []
    for f in scan:
        if f.get("category") not in cats:
            continue
        mod = str(f.get("module") or "")
        if node.path != STEP and not (_within(mod, node.path) or _in_ranges(str(f.get("file") or ""),
                                                                          int(f.get("line") or 0), ranges)):
            continue
        inside.append(f)
    at = r.raised_at if r.status == "fail" and r.raised_at else None
    exact = [f for f in inside if at and _same_site(f, at)]
    return (exact or inside or [None])[0]


def _finding(node: Node, scan: list[dict]) -> Finding:
    r = node.result
    cat = CATEGORY[r.status]
    sev = "blocks-capture" if cat == "capture-failure" else "silent-corruption"
    match = scan_match(node, scan) if scan else None
    src = r.source or {}
    miss = r.missing_at if r.status in ("empty", "uncaptured") and (r.missing_at or {}).get("line") else None
    if r.status == "fail" and r.raised_at:
        file, line, func = r.raised_at.get("file"), r.raised_at.get("line"), r.raised_at.get("function")
    elif miss:
        file, line, func = miss.get("file"), miss.get("line"), miss.get("function")
    elif match:
        file, line, func = match.get("file"), match.get("line"), match.get("function")
    else:
        file, line, func = src.get("file"), src.get("line"), src.get("function")
    what = f"{node.path} ({r.module_type})" if node.path != STEP else f"the whole step ({r.module_type})"
    msg = f"trial capture of {what}: {r.describe()}"
    if r.status == "fail" and r.raised_in and r.raised_in != node.path:
        msg += f"; raised inside {r.raised_in}"
    if r.status == "fail" and r.raised_at and r.raised_at.get("code"):
        msg += f"; at `{r.raised_at['code']}`"
    if miss:
        msg += f"; first kernel missing from the graph: `{miss.get('kernel', '?')[:80]}` launched by `{miss.get('op')}`"
    scan_at = f"{rel_path(match.get('file'))}:{match.get('line')}" if match else None
    if match:
        msg += f"; CPU scan: {match.get('category')} `{match.get('op')}` at {scan_at}"
    extra = {k: v for k, v in {
        "status": r.status, "error_class": r.error_class, "eager_kernels": r.eager_kernels,
        "graph_kernels": r.graph_kernels, "max_abs_diff": r.max_abs_diff, "first_diff": r.first_diff,
        "raised_in": r.raised_in, "scan_match": scan_at,
        "defined_at": f"{rel_path(src.get('file'))}:{src.get('line')}" if src.get("file") else None,
    }.items() if v is not None}
    op = r.error_class if r.status == "fail" else ("graph replay" if r.status == "mismatch" else "kernel launch")
    return Finding(cat, sev, rel_path(file), int(line or 0), func or "?", node.path, op, 1.0, msg,
                   FIX.get(r.error_class or "", ""), extra=extra)


def findings(report: BisectReport, scan: list[dict] | None = None) -> list[Finding]:
    """One finding per failing leaf, plus cross-device for a capture stream on the wrong device."""
    out = [_finding(n, scan or []) for n in report.root.walk() if n.leaf]
    seen = set()
    for n in report.root.walk():
        for w in (n.result.warnings if n.result else []):
            if "capture stream is on" in w and w not in seen:
                seen.add(w)
                src = n.result.source or {}
                out.append(Finding("cross-device", "silent-corruption", rel_path(src.get("file")),
                                   int(src.get("line") or 0), src.get("function") or "?", n.path, "capture stream",
                                   1.0, w))
    return out


def inventory(report: BisectReport, scan: list[dict] | None = None) -> Inventory:
    inv = Inventory.from_findings(findings(report, scan), dict(report.meta))
    inv.meta.update(kind="bisect", captures=report.captures, seconds=round(report.seconds, 3),
                    counts=report.counts(), leaves=[n.path for n in report.leaves])
    return inv


def load_scan(path) -> list[dict]:
    """Findings of a previous `dsv4-audit scan` (its inventory.json), to point leaves at lines."""
    import json

    try:
        data = json.loads(open(path).read())
    except FileNotFoundError:
        raise AuditError(f"--scan {path}: no such file") from None
    except json.JSONDecodeError as e:
        raise AuditError(f"--scan {path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("findings"), list):
        raise AuditError(f"--scan {path}: not an inventory.json (no 'findings' list)")
    return data["findings"]


def summary_line(report: BisectReport) -> str:
    c = report.counts()
    parts = [f"{v} {k}" for k, v in c.items() if v]
    leaves = ", ".join(f"{n.path} [{n.status}{': ' + n.result.error_class if n.result.error_class else ''}]"
                       for n in report.leaves) or "none"
    return f"{report.captures} captures in {report.seconds:.1f} s: {', '.join(parts)}; failing leaves: {leaves}"

