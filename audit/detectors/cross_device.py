"""cross-device (CUDA scans): one op or copy touching two devices inside the step.

A graph belongs to one device and is captured on one stream; work on another device is not in
it (empty graph on device 0, stale replay elsewhere: measured on a real port). Host<->device copies are
pageable-copy's business; 0-dim CPU tensors (scalars) are allowed operands and skipped, and so are tensors on
the meta device (no memory, no kernel: a jagged nested tensor's view op takes a meta placeholder for its ragged
size).
"""

from __future__ import annotations

from audit.detectors import register


def _devices(rec):
    return {str(m.device) for m in rec.inputs + rec.outputs if m.device.type not in ("cpu", "meta")}


@register("cross-device", cuda_only=True)
def spanning_ops(ctx):
    """An op whose tensors live on more than one accelerator, or on one the scan did not target."""
    home = ctx.trace.device
    recs = []
    for r in ctx.all_records():
        devs = _devices(r)
        if len(devs) > 1 or (devs and home.count(":") and devs != {home}):
            recs.append((r, sorted(devs)))
    groups = ctx.per_site(r for r, _ in recs)
    devs_of = {id(r): d for r, d in recs}
    return [ctx.finding("cross-device", g[0], op, len(g) / ctx.n_steps,
                        f"`{op}` spans devices {', '.join(devs_of[id(g[0])])} inside one step")
            for (_, _, op, _), g in groups.items()]
