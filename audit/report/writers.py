"""Inventory files: inventory.json (findings + scan summary), inventory.md, inventory.csv; diffs.

The markdown is what an engineer would otherwise write by hand (teams keep such files by hand): summary on
top, then one section per category, most severe first, with file:line (the innermost frame outside
torch, a library's own file included) and the target's own line that led there, op, count per step,
why it matters and the fix. Every file is written to a temporary name and renamed into place, so a
reader never sees half an inventory. `diff_markdown` compares two scans: fixed / new / remaining,
matching findings on category + file + function + op so that edits which shift lines still match
(audit/report/match.py).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pandas as pd

from audit.errors import AuditError
from audit.report.inventory import CATEGORIES, SEVERITIES, SEVERITY_RANK, Inventory
from audit.report.match import match
from audit.report.sarif import sarif
from audit.schema import check_version

__all__ = ["atomic_write", "diff_markdown", "load", "markdown", "write"]

INFO_ROWS = 25  # info-only sections list the top rows; the CSV has all of them


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a report is an ordinary file
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write(inv: Inventory, out_dir: str | Path) -> dict[str, Path]:
    """DIR/inventory.{json,md,csv,sarif}; returns the paths."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise AuditError(f"--out {out}: exists and is not a directory")
    paths = {k: out / f"inventory.{k}" for k in ("json", "md", "csv", "sarif")}
    try:
        atomic_write(paths["json"], json.dumps(inv.to_json_dict(), indent=2, default=str) + "\n")
        atomic_write(paths["md"], markdown(inv))
        atomic_write(paths["csv"], inv.df.to_csv(index=False))
        atomic_write(paths["sarif"], json.dumps(sarif(inv), indent=2, default=str) + "\n")
    except OSError as e:
        raise AuditError(f"--out {out}: cannot write ({e.strerror or e})") from None
    return paths


def load(path: str | Path) -> Inventory:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AuditError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise AuditError(f"{p}: is a directory (pass DIR/inventory.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AuditError(f"{p}: not valid JSON ({e})") from None
    try:
        check_version(data)
        return Inventory.from_json_dict(data)
    except (ValueError, TypeError, KeyError) as e:
        raise AuditError(f"{p}: {e}") from None


# ---------------------------------------------------------------------- markdown
def _cell(v) -> str:
    return str(v if v is not None else "").replace("|", "\\|").replace("\n", " ")


def _count(v) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return str(int(f)) if f == int(f) else f"{f:g}"


def _via(r) -> str:
    """' <- caller.py:31 (step)' when the target's own frame that led to the site is elsewhere."""
    cf, cl = r.get("caller_file"), r.get("caller_line")
    if not cf or (cf == r.get("file") and int(cl or 0) == int(r.get("line") or 0)):
        return ""
    fn = r.get("caller_function")
    return f" <- `{cf}:{cl}`" + (f" ({_cell(fn)})" if fn else "")


def _loc(r) -> str:
    return f"`{r['file']}:{r['line']}`" if r.get("line") else f"`{r['file']}`"


def _summary(inv: Inventory) -> list[str]:
    m = inv.meta
    lines = [f"# CUDA-graph readiness inventory: {m.get('target', '?')}", ""]
    options = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in (m.get("options") or {}).items()) or None
    facts = [("device", m.get("device")), ("path", m.get("path")), ("target options", options),
             ("ranks", _ranks_fact(m)),
             ("steps audited", f"{m.get('audited_steps', '?')} after {m.get('warmup', '?')} warmup"),
             ("ops traced", f"{m.get('traced_ops', '?')} ({m.get('ops_per_second', '?')} ops/s)"),
             ("torch", m.get("torch")), ("generated", m.get("created"))]
    lines += [f"- **{k}**: {v}" for k, v in facts if v is not None]
    if m.get("error"):
        lines += ["", f"> **Partial inventory**: {m['error']}"]
    lines += [""]
    if inv.df.empty:
        return lines + ["No findings: nothing in the audited step stands in the way of a CUDA graph.", ""]
    sev = {s: int((inv.df.severity == s).sum()) for s in SEVERITIES}
    verdict = ("**Not graph-ready**" if sev["blocks-capture"] or sev["silent-corruption"] else "**Graph-ready**")
    lines += [f"{verdict}: " + ", ".join(f"{n} {s}" for s, n in sev.items()) + " finding(s).", ""]
    t = inv.summary()
    lines += ["| category | " + " | ".join(SEVERITIES) + " |", "|---|" + "---:|" * len(SEVERITIES)]
    for cat, row in t.iterrows():
        lines.append(f"| [{cat}](#{cat}) | " + " | ".join(str(int(row[s])) or "" for s in SEVERITIES) + " |")
    return lines + [""]


def _ranks_fact(m: dict) -> str | None:
    """Merged inventories (audit/ranks.py) list their ranks; a rank's own one says which it is."""
    if m.get("ranks"):
        return f"{m['ranks']} (merged; each finding names the rank(s) that have it; per rank: rank<r>/inventory.md)"
    if m.get("world_size"):
        return f"this is rank {m.get('rank')} of {m['world_size']}"
    return None


def _section(cat: str, df: pd.DataFrame, by_rank: bool = False) -> list[str]:
    c = CATEGORIES.get(cat)
    title = c.title if c else cat
    lines = [f"## {cat}", "", f"**{title}.** {c.why if c else ''}", ""]
    rank_col = ("rank(s) | ", "---|") if by_rank else ("", "")
    lines += [f"| file:line | op | count/step | severity | {rank_col[0]}why it matters | fix |",
              f"|---|---|---:|---|{rank_col[1]}---|---|"]
    rows = df.to_dict("records")
    only_info = all(r["severity"] == "info" for r in rows)
    if only_info:
        rows = sorted(rows, key=lambda r: -float(r["count_per_step"] or 0))
    shown = rows[:INFO_ROWS] if only_info else rows
    for r in shown:
        fix = r["fix"] if not c or r["fix"] != c.fix else "usual fix (below)"
        rank = f"{_cell(r.get('rank'))} | " if by_rank else ""
        lines.append(f"| {_loc(r)} {_cell(r.get('function') and '(' + r['function'] + ')')}{_via(r)} | `{_cell(r['op'])}` | "
                     f"{_count(r['count_per_step'])} | {r['severity']} | {rank}{_cell(r['message'])} | {_cell(fix)} |")
    if len(rows) > len(shown):
        lines.append(f"| ... | | | | {len(rows) - len(shown)} more rows in inventory.csv | |")
    if c:
        lines += ["", f"Usual fix: {c.fix}"]
    return lines + [""]


def markdown(inv: Inventory) -> str:
    lines = _summary(inv)
    if not inv.df.empty:
        order = sorted(inv.df.category.unique(),
                       key=lambda k: (inv.df[inv.df.category == k].severity.map(SEVERITY_RANK).min(), k))
        by_rank = bool(inv.meta.get("ranks")) and "rank" in inv.df.columns
        for cat in order:
            lines += _section(cat, inv.df[inv.df.category == cat], by_rank)
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------- diff
def _table(rows: list[dict], moved: dict | None = None) -> list[str]:
    if not rows:
        return ["None.", ""]
    info = [r for r in rows if r["severity"] == "info"]
    hidden = len(info) if len(info) > INFO_ROWS else 0
    if hidden:
        rows = [r for r in rows if r["severity"] != "info"]
    out = ["| category | severity | file:line | op | count/step | message |", "|---|---|---|---|---:|---|"]
    if not rows:
        out = []
    for r in sorted(rows, key=lambda r: (SEVERITY_RANK.get(r["severity"], 9), r["category"], r["file"], r["line"])):
        note = f" (was line {moved[id(r)]})" if moved and id(r) in moved else ""
        out.append(f"| {r['category']} | {r['severity']} | {_loc(r)}{note}{_via(r)} | `{_cell(r['op'])}` | "
                   f"{_count(r['count_per_step'])} | {_cell(r['message'])} |")
    if hidden:
        out += ["", f"...and {hidden} info finding(s) (allocations and the like), listed in the inventories."]
    return out + [""]


def diff_markdown(cur: Inventory, base: Inventory) -> str:
    fixed, new, pairs = match(cur.findings(), base.findings())
    remaining = [r for r, _ in pairs]
    moved = {id(r): b["line"] for r, b in pairs if r["line"] != b["line"]}
    blocking = lambda rs: sum(r["severity"] in SEVERITIES[:2] for r in rs)
    lines = [f"# Inventory diff: {cur.meta.get('target', '?')}", "",
             f"- **current**: {cur.meta.get('created', '?')} ({len(cur)} findings)",
             f"- **baseline**: {base.meta.get('created', '?')} ({len(base)} findings)", "",
             (f"**{len(fixed)} fixed** ({blocking(fixed)} blocking or silent), **{len(new)} new** "
              f"({blocking(new)} blocking or silent), **{len(remaining)} remaining** "
              f"({blocking(remaining)} blocking or silent)."), ""]
    for title, rows, mv in (("Fixed", fixed, None), ("New", new, None), ("Remaining", remaining, moved)):
        lines += [f"## {title}", ""] + _table(rows, mv)
    return "\n".join(lines).rstrip() + "\n"
