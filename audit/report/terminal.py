"""What a person sees in the terminal: the summary table of a scan and `dsv4-audit report`."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from audit.errors import AuditError
from audit.report import writers
from audit.report.inventory import SEVERITIES, Inventory

__all__ = ["print_summary", "report_command", "summary_table"]

_SHORT = {"blocks-capture": "blocks", "silent-corruption": "silent", "performance": "perf", "info": "info"}
_STYLE = {"blocks-capture": "bold red", "silent-corruption": "red", "performance": "yellow", "info": "dim"}


def summary_table(inv: Inventory) -> Table:
    """Category x severity counts plus the worst location of each category."""
    t = Table(title=f"CUDA-graph hazards: {inv.meta.get('target', '')}", title_justify="left",
              caption="blocks = blocks-capture, silent = silent-corruption, perf = performance",
              caption_justify="left")
    t.add_column("category", no_wrap=True, min_width=22)
    for s in SEVERITIES:
        t.add_column(_SHORT[s], justify="right", style=_STYLE[s], no_wrap=True)
    t.add_column("first location", overflow="fold")
    summ = inv.summary()
    for cat, row in summ.iterrows():
        first = inv.df[inv.df.category == cat].iloc[0]
        t.add_row(cat, *[str(int(row[s])) if row[s] else "" for s in SEVERITIES], f"{first.file}:{first.line}")
    return t


def print_summary(console: Console, inv: Inventory, paths: dict | None) -> None:
    m = inv.meta
    stopped = bool(m.get("error"))  # the target raised: what ran is all the inventory can speak for
    if len(inv):
        console.print(summary_table(inv))
    elif not stopped:
        console.print("[green]no findings[/]: nothing in the audited step stands in the way of a CUDA graph")
    sev = m.get("findings", {})
    blocking = sev.get("blocks-capture", 0) + sev.get("silent-corruption", 0)
    verdict = ("[bold red]scan stopped, no verdict[/]" if stopped else
               "[bold red]not graph-ready[/]" if blocking else "[bold green]graph-ready[/]")
    console.print(f"{verdict}: {blocking} blocking or silent finding(s), {len(inv)} in all", highlight=False)
    console.print(f"traced {m.get('traced_ops', 0)} ops over {m.get('audited_steps', 0)} audited step(s) in "
                  f"{m.get('traced_seconds', 0):.2f} s ({m.get('ops_per_second', 0):.0f} ops/s); "
                  f"scan took {m.get('scan_seconds', 0):.1f} s", highlight=False)
    if paths:
        console.print("wrote " + ", ".join(str(p) for p in paths.values()), highlight=False, soft_wrap=True)


def report_command(inventory: Path, baseline: Path | None, out: Path | None, console: Console) -> int:
    """Markdown of one inventory, or of its diff against a baseline; to --out or stdout."""
    inv = writers.load(inventory)
    text = writers.diff_markdown(inv, writers.load(baseline)) if baseline else writers.markdown(inv)
    if out:
        if out.is_dir():
            raise AuditError(f"--out {out}: is a directory (give a file name, e.g. {out}/diff.md)")
        writers.atomic_write(out, text)
        console.print(f"wrote {out}", highlight=False)
    else:
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    return 0
