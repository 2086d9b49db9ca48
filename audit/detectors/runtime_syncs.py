"""host-sync (CUDA scans): the waits the CUDA runtime itself reports, on lines no other rule explains.

Sync-debug mode warns when a C++ call synchronizes (`_grouped_mm`'s fallback reading its offsets back, a
pageable copy inside an op), and torch.cuda._gpu_trace reports each stream or device synchronization. Both
land at the line whose call synchronized; a line gets one finding, named after the op when sync-debug mode
saw it.
"""

from __future__ import annotations

from audit.detectors import register
from audit.detectors.host_sync import _covered, _runtime


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


@register("host-sync", cuda_only=True)
def runtime_reported_syncs(ctx):
    """CUDA scans: syncs the runtime reported (sync-debug-mode warnings, torch.cuda._gpu_trace
    callbacks) at the line that synchronized, where no rule above already explains the line."""
    covered = _covered(ctx)
    groups: dict = {}
    for recs in ctx.steps:
        for i, r in enumerate(recs):
            if r.kind != "sync" or not _runtime(r) or not r.frame or (r.step,) + r.frame[:2] in covered:
                continue
            if r.note == "gpu_trace":
                op, why = r.op, f"the CUDA runtime reported a {r.op[5:]} here (torch.cuda._gpu_trace)"
            else:
                op, why = _syncing_op(recs, i), f"sync-debug mode: {r.note.split(chr(0))[-1]}"
            groups.setdefault(r.frame[:2], []).append((r, why, op))
    # one finding per line: the op sync-debug mode names, rather than the runtime's bare "stream synchronization"
    best = {k: min(g, key=lambda x: x[0].note == "gpu_trace") for k, g in groups.items()}
    return [ctx.finding("host-sync", best[k][0], best[k][2], len({x[0].step for x in g}) / ctx.n_steps, best[k][1])
            for k, g in groups.items()]
