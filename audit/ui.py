"""Terminal side of `dsv4-audit scan` / `report`: progress bar, summary table, files written.

cli.py only parses options; everything a command does lives here so the CLI stays thin and the
behaviour is testable without a terminal.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from audit import ranks, report
from audit.errors import AuditError, TargetFailed
from audit.inventory import SEVERITIES, Inventory
from audit.scan import scan
from audit.target import check_tp

__all__ = ["default_out", "report_command", "scan_command", "summary_table"]

_SHORT = {"blocks-capture": "blocks", "silent-corruption": "silent", "performance": "perf", "info": "info"}
_STYLE = {"blocks-capture": "bold red", "silent-corruption": "red", "performance": "yellow", "info": "dim"}


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_out(name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Path("reports") / f"scan-{safe}"


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


def _print_summary(console: Console, inv: Inventory, paths: dict | None) -> None:
    m = inv.meta
    if len(inv):
        console.print(summary_table(inv))
    else:
        console.print("[green]no findings[/]: nothing in the audited step stands in the way of a CUDA graph")
    sev = m.get("findings", {})
    blocking = sev.get("blocks-capture", 0) + sev.get("silent-corruption", 0)
    verdict = "[bold red]not graph-ready[/]" if blocking else "[bold green]graph-ready[/]"
    console.print(f"{verdict}: {blocking} blocking or silent finding(s), {len(inv)} in all", highlight=False)
    console.print(f"traced {m.get('traced_ops', 0)} ops over {m.get('audited_steps', 0)} audited step(s) in "
                  f"{m.get('traced_seconds', 0):.2f} s ({m.get('ops_per_second', 0):.0f} ops/s); "
                  f"scan took {m.get('scan_seconds', 0):.1f} s", highlight=False)
    if paths:
        console.print("wrote " + ", ".join(str(p) for p in paths.values()), highlight=False, soft_wrap=True)


def scan_command(target: str | None, path: str, device: str | None, steps: int, warmup: int,
                 out: Path | None, console: Console, err_console: Console, tp: int | None = None) -> int:
    """Runs a scan with a progress bar, writes the inventory, prints the summary; returns the exit code.

    Bad input raises AuditError (the CLI turns it into exit 2). A target that raises mid-run still
    gets its partial inventory written, then one error line and exit code 1. Under torchrun every
    rank scans its own step (see audit/ranks.py); tp shards a dsv4 target over the ranks."""
    target = target or "dsv4:tiny"
    run = ranks.launch()
    tp = ranks.resolve_tp(tp, run, target)
    device = device or default_device()
    if out is None and target.startswith("dsv4:"):
        out = default_out(f"{target[5:]}-{path}" + (f"-tp{tp}" if tp > 1 else ""))
    if run is not None and run.world > 1:
        return _scan_ranks(run, target, path, device, steps, warmup, out, tp, console, err_console)
    inv, failed = _scan_with_bar(target, path, device, steps, warmup, tp, err_console)
    out = out or default_out(inv.meta.get("name", "target"))
    paths = report.write(inv, out)
    _print_summary(console, inv, paths)
    return _failed(failed, err_console)


def _scan_with_bar(target, path, device, steps, warmup, tp, err_console, show: bool = True):
    """(inventory, failure message or None); the progress bar only where `show`."""
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=err_console, transient=True, disable=not show) as bar:
        task = bar.add_task(f"scanning {target}", total=warmup + steps)

        def tick(done: int, total: int, phase: str) -> None:
            bar.update(task, completed=done, description=f"scanning {target} ({phase})")

        try:
            inv = scan(target, device=device, steps=steps, warmup=warmup, path=path, progress=tick, gpu_trace=True,
                       tp=tp)
        except TargetFailed as e:
            return e.inventory, str(e)
    return inv, None


def _failed(failed: str | None, err_console: Console) -> int:
    if failed:
        err_console.print(f"[bold red]error:[/] {failed}", highlight=False, soft_wrap=True)
        err_console.print("(the inventory above is partial: it covers what ran before the error)")
        return 1
    return 0


def _scan_ranks(run: ranks.Launch, target: str, path: str, device: str, steps: int, warmup: int,
                out: Path | None, tp: int, console: Console, err_console: Console) -> int:
    """One rank of a torchrun launch: scan, write OUT/rank{r}/, send to rank 0, which writes the merge."""
    import torch.distributed as dist

    device = ranks.rank_device(device, run)
    if tp > 1:
        check_tp(target, tp)  # before the rendezvous, so a bad world size fails alike everywhere
    started = ranks.init(run, device)
    try:
        inv, failed = _scan_with_bar(target, path, device, steps, warmup, tp, err_console, show=run.rank == 0)
        inv = ranks.tag(inv, run.rank, run.world)
        out = out or default_out(inv.meta.get("name", "target"))
        report.write(inv, out / f"rank{run.rank}")
        everyone = ranks.gather(inv, run)
        if started:
            ranks.shutdown()
    finally:
        if started and dist.is_initialized():  # an error on the way: no barrier, the peers may be gone
            dist.destroy_process_group()
    if everyone is None:  # not rank 0: its own failure is its exit code; rank 0 prints the merge
        if failed:
            err_console.print(f"[bold red]error (rank {run.rank}):[/] {failed}", highlight=False, soft_wrap=True)
        return 1 if failed else 0
    merged = ranks.merge(everyone)
    paths = report.write(merged, out)
    _print_summary(console, merged, paths)
    console.print(f"per-rank inventories: {out}/rank0 .. rank{run.world - 1}", highlight=False)
    return _failed(merged.meta.get("error"), err_console)


def report_command(inventory: Path, baseline: Path | None, out: Path | None, console: Console) -> int:
    """Markdown of one inventory, or of its diff against a baseline; to --out or stdout."""
    inv = report.load(inventory)
    text = report.diff_markdown(inv, report.load(baseline)) if baseline else report.markdown(inv)
    if out:
        if out.is_dir():
            raise AuditError(f"--out {out}: is a directory (give a file name, e.g. {out}/diff.md)")
        report.atomic_write(out, text)
        console.print(f"wrote {out}", highlight=False)
    else:
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    return 0
