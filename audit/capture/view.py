"""`dsv4-audit bisect` end to end: CUDA check, worker pool, progress bar, rich tree, report files.

Kept apart from audit/capture/bisect.py so the search logic stays importable (and testable) without rich
output or a GPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.tree import Tree

from audit.capture.bisect import (STEP, BisectReport, Node, bisect, inventory, load_scan, parse_layers, rel_path,
                                  summary_line)
from audit.errors import AuditError

__all__ = ["require_cuda", "render_tree", "run_bisect", "write_outputs"]

STYLE = {"pass": "green", "fail": "bold red", "empty": "bold magenta", "uncaptured": "bold magenta",
         "mismatch": "bold yellow", "not-called": "dim", "error": "red", "pending": "dim"}
MARK = {"pass": "✓", "fail": "✗", "empty": "∅", "uncaptured": "◌", "mismatch": "≠", "not-called": "·",
        "error": "!", "pending": "?"}


def require_cuda(device: str) -> str:
    """The capture device, or one AuditError line saying there is none (the CLI exits 2)."""
    import torch

    if not torch.cuda.is_available():
        raise AuditError("bisect needs a CUDA GPU and this machine has none; "
                         "run `dsv4-audit scan` for the CPU audit")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise AuditError(f"--device {device!r}: expected cuda or cuda:N") from None
    if dev.type != "cuda":
        raise AuditError(f"--device {device!r}: bisect captures CUDA graphs, pass cuda or cuda:N")
    n = torch.cuda.device_count()
    if dev.index is not None and dev.index >= n:
        raise AuditError(f"--device {device}: only {n} CUDA device(s) here")
    return str(dev) if dev.index is not None else "cuda:0"


def _label(node: Node) -> str:
    r, s = node.result, node.status
    head = f"[{STYLE[s]}]{MARK[s]} {s}[/] [bold]{escape(node.path)}[/]"
    if r is None:
        return head
    kind = f" [dim]{escape(r.module_type or '')}[/]"
    detail = escape(r.describe()) if s != "pass" else f"[dim]{escape(r.describe())}[/]"
    leaf = " [bold red]◀ leaf[/]" if node.leaf else ""
    where = ""
    if node.leaf and r.raised_at:
        where = f" [cyan]{escape(str(r.raised_at.get('file')))}:{r.raised_at.get('line')}[/]"
    return f"{head}{kind} — {detail}{leaf}{where}"


def render_tree(report: BisectReport) -> Tree:
    """Every captured node with its verdict; passing layers are shown, not expanded."""
    root = Tree(_label(report.root), guide_style="dim")

    def add(parent: Tree, node: Node) -> None:
        branch = parent.add(_label(node))
        for c in node.children:
            add(branch, c)

    for c in report.root.children:
        add(root, c)
    return root


def write_outputs(report: BisectReport, inv, out: Path) -> list[Path]:
    """inventory.json / .md / .csv (through audit/report/writers.py when present) and bisect.json (the tree)."""
    out.mkdir(parents=True, exist_ok=True)
    written = _report_writer(inv, out)
    tree = out / "bisect.json"
    tree.write_text(json.dumps(_relative(report.to_dict()), indent=2, default=str))
    return written + [tree]


def _relative(tree):
    """Source files in the tree as a person opens them: relative to the working directory when
    inside it (bisect.json is a report; an absolute path names one machine)."""
    if isinstance(tree, dict):
        return {k: _relative(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_relative(v) for v in tree]
    if isinstance(tree, str) and os.path.isabs(tree) and os.path.isfile(tree):
        return rel_path(tree)
    return tree


def _report_writer(inv, out: Path) -> list[Path]:
    """audit/report/writers.py writes the inventory files (the same format as `scan`); a plain fallback
    keeps bisect usable if that module is unavailable."""
    try:
        from audit.report.writers import write
    except ImportError:
        return _fallback_write(inv, out)
    res = write(inv, out)
    return list(res.values()) if isinstance(res, dict) else [Path(p) for p in res]


def _fallback_write(inv, out: Path) -> list[Path]:
    paths = [out / "inventory.json", out / "inventory.md", out / "inventory.csv"]
    paths[0].write_text(json.dumps(inv.to_json_dict(), indent=2, default=str))
    inv.df.to_csv(paths[2], index=False)
    lines = [f"# Capture bisection: {inv.meta.get('target', '')}", "",
             f"{len(inv)} finding(s) from {inv.meta.get('captures', 0)} trial captures.", "",
             "| category | severity | file:line | module | message |", "|---|---|---|---|---|"]
    for f in inv.findings():
        msg = str(f.get("message", "")).replace("|", "\\|")
        lines.append(f"| {f['category']} | {f['severity']} | {f['file']}:{f['line']} | {f['module']} | {msg} |")
    paths[1].write_text("\n".join(lines) + "\n")
    return paths


def run_bisect(target: str, *, path: str = "reference", layers: str | None = None, device: str = "cuda:0",
               out: Path | None = None, root: str | None = None, mode: str = "global", steps: int = 3,
               warmup: int = 2, scan: Path | None = None, timeout: float = 600.0, stream_device: str | None = None,
               console: Console | None = None, options: dict | None = None):
    """Runs the whole bisection with a progress bar; returns (report, inventory).

    options: the target's (cache, batch, prompt_len: hf: and dsv4: targets), as for `scan`."""
    from audit.capture.pool import CapturePool

    console = console or Console()
    device = require_cuda(device)
    if mode not in ("global", "thread_local", "relaxed"):
        raise AuditError(f"--mode must be global, thread_local or relaxed, not {mode!r}")
    if steps < 1 or warmup < 2:
        raise AuditError("--steps must be >= 1 and --warmup >= 2")
    scan_findings = load_scan(scan) if scan else None
    session = {"target": target, "path": path, "device": device, "mode": mode, "steps": steps, "warmup": warmup,
               "root": root, "stream_device": stream_device, "options": dict(options or {})}
    with CapturePool(session, timeout=timeout) as pool:
        with console.status(f"building {target} in a capture worker..."):
            info = pool.start()
        all_layers = info["layers"]
        chosen = [all_layers[i] for i in parse_layers(layers, len(all_layers))]
        console.print(f"[bold]{info['label']}[/]: {len(all_layers)} layers under "
                      f"[cyan]{escape(info['layers_root'] or '<target>')}[/], bisecting {len(chosen)} on {device}")
        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("capture <step>", total=1)

            def capture(p):
                progress.update(task, description=f"capture {escape(p or STEP)}")
                return pool.capture(p)

            def on_result(node: Node) -> None:
                progress.advance(task)
                if node.result and node.status != "pass":
                    progress.console.print(_label(node))

            def on_queue(k: int) -> None:
                progress.update(task, total=(progress.tasks[0].total or 0) + k)

            report = bisect(capture, chosen, on_result=on_result, on_queue=on_queue)
        report.layers_root = info["layers_root"]
        report.meta.update(target=info["label"], spec=target, path=path, device=device, mode=mode, steps=steps,
                           warmup=warmup, layers=chosen, workers_started=pool.spawned)
    console.print(render_tree(report))
    inv = inventory(report, scan_findings)
    console.print(summary_line(report), highlight=False)
    out = Path(out) if out is not None else Path("reports") / f"bisect-{_safe(info.get('name') or 'target')}"
    for p in write_outputs(report, inv, out):
        console.print(f"wrote [cyan]{escape(str(p))}[/]")
    return report, inv


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)
