"""`assert_graph_ready` for a project's own test suite: a decode step, once fixed, stays graph-ready.

    from audit.testing import assert_graph_ready

    def test_decode_step_is_graph_ready():
        assert_graph_ready(make_decoder, device="cpu", steps=4, allow=["rng", "model.py:sample"])

A failure raises AssertionError whose message is the inventory's table in plain text (readable in
pytest's output), not a traceback through the auditor. The `graph_ready` fixture (audit/pytest_plugin.py)
is the same function with the device taken from `pytest --graph-ready-device`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from audit.errors import TargetFailed
from audit.report.gate import FAIL_ON, at_or_above
from audit.report.inventory import CATEGORIES, Inventory

__all__ = ["assert_graph_ready", "format_table", "is_allowed"]


def _site_matches(spec: str, file: str, line, function) -> bool:
    """`spec` is "path:line" or "path:function"; path matches the end of `file` at a separator."""
    where, _, what = spec.rpartition(":")
    f = str(file or "").replace("\\", "/")
    where = where.replace("\\", "/")
    if not (f == where or f.endswith("/" + where.lstrip("/"))):
        return False
    return str(line) == what if what.isdigit() else what == (function or "")


def is_allowed(finding: dict, allow: Iterable[str]) -> bool:
    """True when an `allow` entry names the finding's category, its innermost site or its caller site."""
    for spec in allow:
        if spec == finding.get("category"):
            return True
        if ":" in spec and (_site_matches(spec, finding.get("file"), finding.get("line"), finding.get("function"))
                            or _site_matches(spec, finding.get("caller_file"), finding.get("caller_line"),
                                             finding.get("caller_function"))):
            return True
    return False


def _check_allow(allow: Iterable[str]) -> list[str]:
    allow = [allow] if isinstance(allow, str) else list(allow)
    for spec in allow:
        if not isinstance(spec, str) or (spec not in CATEGORIES and ":" not in spec):
            raise ValueError(f"allow entry {spec!r}: expected a category ({', '.join(CATEGORIES)}) "
                             "or a site 'file:line' / 'file:function'")
    return allow


def format_table(rows: list[dict]) -> str:
    """Plain-text table (fixed-width columns) of findings: severity, category, site, caller, op, count, message."""
    head = ("severity", "category", "site", "called from", "op", "n/step", "message")
    body = []
    for r in rows:
        site = f"{r['file']}:{r['line']} ({r.get('function') or '?'})"
        caller = f"{r.get('caller_file')}:{r.get('caller_line')}"
        caller = "" if caller == f"{r['file']}:{r['line']}" or not r.get("caller_file") else caller
        n = r.get("count_per_step")
        body.append((r["severity"], r["category"], site, caller, str(r.get("op") or ""),
                     "" if n is None else f"{float(n):g}", str(r.get("message") or "")[:100]))
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head) - 1)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  " + cells[-1]
    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths) + ("-" * 7,))] + [fmt(b) for b in body])


def _message(inv: Inventory, bad: list[dict], fail_on: str, n_allowed: int, failed: str | None) -> str:
    target = inv.meta.get("target", "target")
    lines = [f"{target} is not graph-ready: {len(bad)} finding(s) at or above {fail_on}"
             + (f" ({n_allowed} more allowed)" if n_allowed else "")]
    if failed:
        lines.append(f"the target raised, so this covers only what ran before: {failed}")
    lines += ["", format_table(bad), "", "usual fixes:"]
    lines += [f"  {c}: {CATEGORIES[c].fix}" for c in dict.fromkeys(r["category"] for r in bad)]
    return "\n".join(lines)


def assert_graph_ready(make: Callable | str, device: str = "cpu", steps: int = 4, allow: Iterable[str] = (),
                       *, warmup: int = 2, path: str = "reference", fail_on: str = "silent-corruption") -> Inventory:
    """Scans `make` (a factory make(device) -> obj with prepare(i)/step(), 'file.py:make' or 'dsv4:<preset>')
    and raises AssertionError with the findings' table when one at or above `fail_on` is not allowed.

    allow: categories ("rng") or sites ("path/to/file.py:123", "file.py:function"), matched against the
    innermost site and the caller site. Returns the inventory when the step is graph-ready."""
    __tracebackhide__ = True
    from audit.scan.run import scan

    allow = _check_allow(allow)
    if fail_on not in FAIL_ON:
        raise ValueError(f"fail_on must be one of {', '.join(FAIL_ON)}, not {fail_on!r}")
    failed = None
    try:
        inv = scan(make, device=device, steps=steps, warmup=warmup, path=path)
    except TargetFailed as e:
        inv, failed = e.inventory, str(e)
    hits = at_or_above(inv, fail_on)
    bad = [f for f in hits if not is_allowed(f, allow)]
    if bad or failed:
        raise AssertionError(_message(inv, bad, fail_on, len(hits) - len(bad), failed))
    return inv
