"""host-sync (CUDA scans): the waits the CUDA runtime itself reports, on lines no other rule explains.

Sync-debug mode warns when a C++ call synchronizes (`_grouped_mm`'s fallback reading its offsets back, a
pageable copy inside an op), and torch.cuda._gpu_trace reports each stream or device synchronization. Both
land at the line whose call synchronized; a line gets one finding, named after the op when sync-debug mode
saw it.
"""

from __future__ import annotations

from audit.detectors import register
from audit.detectors.host_sync import SYNC_OPS, _covered, _runtime, copy_sides


def _syncing_op(recs: list, i: int) -> str:
    """The op a sync-debug warning belongs to. Torch hands the warning to Python as the C++ call that
    synchronized returns: inside the tracer's dispatch (the op is the next record) or after the
    op's record (the last op before it on the same line)."""
    at, inside = recs[i].stack, recs[i].note.split("\x00")[1:2] == ["in"]
    if inside and i + 1 < len(recs) and recs[i + 1].kind == "aten" and recs[i + 1].stack == at:
        return recs[i + 1].op
    for r in reversed(recs[:i]):
        if r.kind == "aten" and r.stack == at:
            return r.op
        if r.stack != at:
            break
    return "synchronizing call"


def _syncs(r) -> bool:
    """An op that synchronizes by itself: a copy between host and device memory, or a rule of host_sync's."""
    sides = copy_sides(r)
    if sides and {sides[0].device.type, sides[1].device.type} == {"cpu", "cuda"}:
        return True
    rule = SYNC_OPS.get(r.op)
    return bool(rule and rule(r))


def _nested_source(recs: list, i: int):
    """The op that made sync warning i, when it ran nested under the warning's line: torch holds a C++
    warning until the outermost call returns to Python, so a copy made by Python code that call ran (a tensor
    subclass's `__torch_dispatch__` moving a host codebook to the device) surfaces at the outer line. The
    latest synchronizing op recorded deeper in that same call since the line's own last op, or None."""
    at = recs[i].stack
    for r in reversed(recs[:i]):
        if len(r.stack) <= len(at) or r.stack[:len(at)] != at:
            return None
        if r.kind == "aten" and _syncs(r):
            return r
    return None


@register("host-sync", cuda_only=True)
def runtime_reported_syncs(ctx):
    """CUDA scans: syncs the runtime reported (sync-debug-mode warnings, torch.cuda._gpu_trace
    callbacks) at the line that synchronized, where no rule above already explains the line."""
    covered = _covered(ctx)
    groups: dict = {}
    for recs in ctx.steps:
        for i, r in enumerate(recs):
            if r.kind != "sync" or not _runtime(r) or not r.frame:
                continue
            if r.note != "gpu_trace" and (src := _nested_source(recs, i)) is not None:
                r = src  # the nested op's own line (its pageable-copy finding, where it has one, explains it)
            if (r.step,) + r.frame[:2] in covered:
                continue
            if r.kind == "aten":
                op, why = r.op, "sync-debug mode: a call the line made synchronized (torch held the warning until it returned)"
            elif r.note == "gpu_trace":
                op, why = r.op, f"the CUDA runtime reported a {r.op[5:]} here (torch.cuda._gpu_trace)"
            else:
                op, why = _syncing_op(recs, i), f"sync-debug mode: {r.note.split(chr(0))[-1]}"
            groups.setdefault(r.frame[:2], []).append((r, why, op))
    # one finding per line: the op sync-debug mode names, rather than the runtime's bare "stream synchronization"
    best = {k: min(g, key=lambda x: x[0].note == "gpu_trace") for k, g in groups.items()}
    return [ctx.finding("host-sync", best[k][0], best[k][2], len({x[0].step for x in g}) / ctx.n_steps, best[k][1])
            for k, g in groups.items()]
