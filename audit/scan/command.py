"""`dsv4-audit scan` in one process: progress bar, scan, inventory files, summary; the exit code.

The route is straight: this module -> run.scan (target, tracer, detectors, inventory) ->
report.writers -> report.terminal. A torchrun launch goes through audit.ranks instead, which
wraps the same pieces per rank.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from audit.errors import TargetFailed
from audit.report import gate, terminal, writers
from audit.report.inventory import Inventory
from audit.scan.run import scan

__all__ = ["default_out", "scan_command", "scan_with_bar"]


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_out(name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Path("reports") / f"scan-{safe}"


def dsv4_out(target: str, path: str, tp: int = 1) -> Path | None:
    """reports/scan-<preset>-<path>[-tpN]/ for dsv4 targets; other targets are named after the scan."""
    return default_out(f"{target[5:]}-{path}" + (f"-tp{tp}" if tp > 1 else "")) if target.startswith("dsv4:") else None


def scan_command(target: str | None, path: str, device: str | None, steps: int, warmup: int,
                 out: Path | None, console: Console, err_console: Console, fail_on: str = "never", *,
                 options: dict | None = None) -> int:
    """Runs a scan with a progress bar, writes the inventory, prints the summary; returns the exit code.

    Bad input raises AuditError (the CLI turns it into exit 2). A target that raises mid-run still
    gets its partial inventory written, then one error line and exit code 1; so does a finding at or
    above `fail_on` (audit/report/gate.py)."""
    target = target or "dsv4:tiny"
    device = device or default_device()
    out = out or (None if options else dsv4_out(target, path))  # with --batch etc.: named after the scan
    inv, failed = scan_with_bar(target, path, device, steps, warmup, err_console, options=options)
    out = out or default_out(inv.meta.get("name", "target"))
    paths = writers.write(inv, out)
    terminal.print_summary(console, inv, paths)
    return report_failure(failed, err_console) or gate.fail_on_code(inv, fail_on, err_console)


def scan_with_bar(target, path, device, steps, warmup, err_console, *, tp: int = 1,
                  show: bool = True, options: dict | None = None) -> tuple[Inventory, str | None]:
    """(inventory, failure message or None); the progress bar only where `show`."""
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=err_console, transient=True, disable=not show) as bar:
        task = bar.add_task(f"scanning {target}", total=warmup + steps)

        def tick(done: int, total: int, phase: str) -> None:
            bar.update(task, completed=done, description=f"scanning {target} ({phase})")

        try:
            inv = scan(target, device=device, steps=steps, warmup=warmup, path=path, progress=tick, gpu_trace=True,
                       tp=tp, options=options)
        except TargetFailed as e:
            return e.inventory, str(e)
    return inv, None


def report_failure(failed: str | None, err_console: Console) -> int:
    if failed:
        err_console.print(f"[bold red]error:[/] {failed}", highlight=False, soft_wrap=True)
        err_console.print("(the inventory above is partial: it covers what ran before the error)")
        return 1
    return 0
