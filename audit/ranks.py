"""Per-rank scans under torchrun: every rank audits its own step, rank 0 merges the inventories.

A tensor-parallel decode step is a different program on each rank (its own heads, its own experts,
collectives in between), so each rank is scanned as it runs, in the same launch as production.
Every finding of rank r carries `rank: r`; each rank writes OUT/rank{r}/inventory.*. The
inventories travel to rank 0 through the process group (so this also works across hosts) and rank 0
writes OUT/inventory.*: one row per (category, file, line, op) over all ranks, its `rank` field
naming the ranks that have it ("0,1"), most severe severity and largest count per step.

The process group is the launch's (torchrun: env://; DIST_INIT_METHOD may name another, e.g. a
file:// store) on NCCL for CUDA scans and gloo for CPU scans.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch

from audit.errors import AuditError
from audit.report.inventory import KEY, SEVERITIES, SEVERITY_RANK, Inventory

__all__ = ["check_tp", "gather", "init", "launch", "merge", "rank_device", "resolve_tp", "scan_command", "shutdown",
           "tag"]


def launch():
    """This process's place in a torchrun launch (rank, world, local_rank), or None outside one."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    from dsv4.decode.parallel import dist_env
    from dsv4.errors import DSV4Error

    try:
        return dist_env()
    except DSV4Error as e:
        raise AuditError(str(e)) from None


def resolve_tp(tp: int | None, run, target: str) -> int:
    """--tp, defaulting to the launch's world size for dsv4 targets; must match the launch."""
    world = run.world if run else 1
    if tp is None:
        return world if target.startswith("dsv4:") else 1
    if tp < 1:
        raise AuditError(f"--tp must be >= 1, not {tp}")
    if tp > 1 and run is None:
        raise AuditError(f"--tp {tp} runs one process per rank: launch with torchrun --nproc-per-node {tp} "
                         "(RANK and WORLD_SIZE are not set)")
    if tp > 1 and tp != world:
        raise AuditError(f"--tp {tp} but torchrun started {world} rank(s); use --nproc-per-node {tp}")
    return tp


def rank_device(device: str, run) -> str:
    """A bare `cuda` means this rank's GPU, cuda:LOCAL_RANK (made current for NCCL)."""
    if device == "cuda" and torch.cuda.is_available():
        device = f"cuda:{run.local_rank}"
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.set_device(torch.device(device))
    return device


def init(run, device: str, timeout_s: float = 300.0) -> bool:
    """Starts the default process group unless one is up; True when this call started it."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=os.environ.get("DIST_INIT_METHOD") or "env://", rank=run.rank,
                            world_size=run.world, timeout=timedelta(seconds=timeout_s))
    return True


def shutdown() -> None:
    """Barrier, then destroy the group: no rank drops its connections while a peer still uses them
    (gloo aborts that peer with `terminate called without an active exception`)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def tag(inv: Inventory, rank: int, world: int) -> Inventory:
    """Every finding of this rank's inventory gets `rank`; the summary says which rank of how many."""
    df = inv.df.copy()
    df["rank"] = rank
    return Inventory(df, dict(inv.meta, rank=rank, world_size=world))


def gather(inv: Inventory, run) -> list[Inventory] | None:
    """Every rank's inventory on rank 0 (None on the others)."""
    import torch.distributed as dist

    box = [None] * run.world if run.rank == 0 else None
    dist.gather_object(inv.to_json_dict(), box, dst=0)
    return [Inventory.from_json_dict(d) for d in box] if box is not None else None


def merge(invs: list[Inventory]) -> Inventory:
    """One inventory over the ranks: per (category, file, line, op), the ranks that have it."""
    groups: dict[tuple, list[dict]] = {}
    for inv in invs:
        for f in inv.findings():
            groups.setdefault(tuple(f[k] for k in KEY), []).append(f)
    rows = []
    for fs in groups.values():
        top = dict(min(fs, key=lambda f: SEVERITY_RANK[f["severity"]]))
        top["count_per_step"] = max(float(f["count_per_step"] or 0) for f in fs)
        top["rank"] = ",".join(str(r) for r in sorted({int(f["rank"]) for f in fs}))
        rows.append(top)
    merged = Inventory.from_findings(rows, _merged_meta(invs))
    merged.meta["findings"] = {s: int((merged.df.severity == s).sum()) if len(merged) else 0 for s in SEVERITIES}
    return merged


def _merged_meta(invs: list[Inventory]) -> dict:
    metas = [i.meta for i in invs]
    m0 = metas[0]
    meta = {k: v for k, v in m0.items() if k not in ("rank", "world_size")}
    devices = list(dict.fromkeys(str(m.get("device")) for m in metas))
    errors = [f"rank {m.get('rank')}: {m['error']}" for m in metas if m.get("error")]
    meta.update(
        ranks=len(invs), device=", ".join(devices),
        audited_steps=min(int(m.get("audited_steps") or 0) for m in metas),
        traced_ops=sum(int(m.get("traced_ops") or 0) for m in metas),
        traced_seconds=round(max(float(m.get("traced_seconds") or 0) for m in metas), 3),
        scan_seconds=round(max(float(m.get("scan_seconds") or 0) for m in metas), 3),
        error="; ".join(errors) or None,
        per_rank=[{"rank": m.get("rank"), "device": m.get("device"), "traced_ops": m.get("traced_ops"),
                   "findings": m.get("findings"), "error": m.get("error")} for m in metas],
    )
    secs = meta["traced_seconds"]
    meta["ops_per_second"] = round(meta["traced_ops"] / secs, 1) if secs else 0.0
    return meta


def check_tp(target: str, tp: int) -> None:
    """Before any rendezvous: can dsv4:<preset> be split over tp ranks? (one line, every rank alike)"""
    from dsv4.config import PRESETS, preset
    from dsv4.decode.parallel import check_world
    from dsv4.errors import DSV4Error

    name = target[5:]
    if name in PRESETS:
        try:
            check_world(preset(name), tp)
        except DSV4Error as e:
            raise AuditError(f"--target {target} --tp {tp}: {e}") from None


def scan_command(target: str | None, path: str, device: str | None, steps: int, warmup: int,
                 out: Path | None, console, err_console, tp: int | None = None, fail_on: str = "never") -> int:
    """One rank of a torchrun launch: scan, write OUT/rank{r}/, send to rank 0, which writes the merge.

    Wraps the single-process pieces (audit.scan.command) from outside; tp shards a dsv4 target."""
    import torch.distributed as dist

    from audit.report import terminal, writers
    from audit.scan.command import default_device, default_out, dsv4_out, report_failure, scan_with_bar

    target = target or "dsv4:tiny"
    run = launch()
    tp = resolve_tp(tp, run, target)
    device = device or default_device()
    if run is not None:
        device = rank_device(device, run)
    out = out or dsv4_out(target, path, tp)
    if run is None:  # --tp 1 outside torchrun
        from audit.scan.command import scan_command as single
        return single(target, path, device, steps, warmup, out, console, err_console, fail_on)
    if tp > 1:
        check_tp(target, tp)  # before the rendezvous, so a bad world size fails alike everywhere
    started = init(run, device)
    try:
        inv, failed = scan_with_bar(target, path, device, steps, warmup, err_console, tp=tp, show=run.rank == 0)
        inv = tag(inv, run.rank, run.world)
        out = out or default_out(inv.meta.get("name", "target"))
        writers.write(inv, out / f"rank{run.rank}")
        everyone = gather(inv, run)
        if started:
            shutdown()
    finally:
        if started and dist.is_initialized():  # an error on the way: no barrier, the peers may be gone
            dist.destroy_process_group()
    if everyone is None:  # not rank 0: its own failure is its exit code; rank 0 prints the merge
        if failed:
            err_console.print(f"[bold red]error (rank {run.rank}):[/] {failed}", highlight=False, soft_wrap=True)
        return 1 if failed else 0
    merged = merge(everyone)
    paths = writers.write(merged, out)
    terminal.print_summary(console, merged, paths)
    console.print(f"per-rank inventories: {out}/rank0 .. rank{run.world - 1}", highlight=False)
    from audit.report.gate import fail_on_code

    return report_failure(merged.meta.get("error"), err_console) or fail_on_code(merged, fail_on, err_console)
