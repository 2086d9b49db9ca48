"""When a CI run fails: `--fail-on SEVERITY` and `report --baseline --fail-on-new`.

Exit codes of the commands that audit (scan, bisect, report): 0 clean, 1 findings at or above the
threshold (or new against the baseline, or the target raised), 2 bad input. The threshold counts
severities from the worst down: `silent-corruption` fails on blocks-capture and silent-corruption.
"""

from __future__ import annotations

from audit.errors import AuditError
from audit.report.inventory import SEVERITY_RANK, Inventory
from audit.report.match import match

__all__ = ["FAIL_ON", "at_or_above", "default_fail_on", "fail_on_code", "new_code", "new_findings"]

FAIL_ON = ("blocks-capture", "silent-corruption", "performance", "never")


def default_fail_on(fail_on: str | None, target_given: bool) -> str:
    """The threshold in force; the embedded demo is full of findings by design, so it never fails bare."""
    if fail_on is None:
        return "silent-corruption" if target_given else "never"
    if fail_on not in FAIL_ON:
        raise AuditError(f"--fail-on must be one of {', '.join(FAIL_ON)}, not {fail_on!r}")
    return fail_on


def at_or_above(inv: Inventory, fail_on: str) -> list[dict]:
    """Findings whose severity is `fail_on` or worse (none for `never`)."""
    if fail_on == "never":
        return []
    limit = SEVERITY_RANK[fail_on]
    return [f for f in inv.findings() if SEVERITY_RANK.get(f["severity"], 99) <= limit]


def _site(f: dict) -> str:
    return f"{f['category']} at {f['file']}:{f['line']}"


def fail_on_code(inv: Inventory, fail_on: str, err_console=None) -> int:
    """1 (and one line saying why) when a finding at or above `fail_on` exists, else 0."""
    bad = at_or_above(inv, fail_on)
    if bad and err_console is not None:
        err_console.print(f"[bold red]fail-on {fail_on}:[/] {len(bad)} finding(s) at or above it, first: "
                          f"{_site(bad[0])}", highlight=False, soft_wrap=True)
    return 1 if bad else 0


def new_findings(cur: Inventory, base: Inventory, fail_on: str = "performance") -> list[dict]:
    """Findings of `cur` at or above `fail_on` that the baseline lacks, matched as the diff matches them
    (audit/report/match.py: category and innermost site, robust to line shifts). Info rows (allocations
    and the like) are legal under capture and never count."""
    return match(at_or_above(cur, fail_on), base.findings())[1]


def new_code(cur: Inventory, base: Inventory, err_console=None) -> int:
    """1 (and one line per new finding) when `cur` has findings the baseline does not, else 0."""
    new = new_findings(cur, base)
    if new and err_console is not None:
        err_console.print(f"[bold red]fail-on-new:[/] {len(new)} finding(s) not in the baseline (info rows "
                          "never count)", highlight=False)
        for f in new:
            err_console.print(f"  {f['severity']} {_site(f)} ({f.get('function') or '?'})", highlight=False,
                              soft_wrap=True)
    return 1 if new else 0
