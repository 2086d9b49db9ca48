"""pageable-copy (CUDA scans): host<->device copies inside the step.

Capture raises on a copy between pageable host memory and the device ("unless the CPU tensor is
pinned"); a pinned host->device copy is captured as a memcpy node, which is the right way to
stage inputs only if the pinned buffer is persistent and refilled outside the graph.
"""

from __future__ import annotations

from audit.detectors import register

PINNED = ("pinned host->device copy inside the step (captured as a memcpy node; the pinned buffer must be "
          "persistent and refilled in prepare())")
PAGEABLE = ("host->device copy from pageable memory: capture raises 'Cannot copy between CPU and CUDA tensors "
            "... unless the CPU tensor is pinned'")
FROM_DATA = ("torch.tensor(data, device=...) inside the step copies Python data from pageable host memory to "
             "the device (and bakes its value)")


def _sides(rec):
    """(source meta, destination meta) of a copy op, or None."""
    if rec.op == "aten._to_copy" and rec.inputs and rec.outputs:
        return rec.inputs[0], rec.outputs[0]
    if rec.op == "aten.copy_" and len(rec.inputs) >= 2:
        return rec.inputs[1], rec.inputs[0]
    return None


@register("pageable-copy", cuda_only=True)
def host_device_copies(ctx):
    """Copies with one side on the CPU: blocking when pageable, info when pinned host->device."""
    hits = []
    for r in ctx.all_records():
        sides = _sides(r)
        if not sides:  # nested ones too: `.cpu()` is a host-sync and a device->host copy
            continue
        src, dst = sides
        if {src.device.type, dst.device.type} != {"cpu", "cuda"}:
            continue
        if src.device.type == "cpu" and src.pinned:
            hits.append((r, "info", PINNED))
        elif src.device.type == "cpu":
            hits.append((r, "blocks-capture", PAGEABLE))
        else:
            hits.append((r, "blocks-capture", "device->host copy inside the step: capture refuses it and it syncs"))
    for r in ctx.all_records():
        if r.op in ("aten.lift_fresh", "aten.lift_fresh_copy") and r.inputs and r.inputs[0].device.type != "cpu":
            hits.append((r, "blocks-capture", FROM_DATA))
    info = {id(r): (sev, msg) for r, sev, msg in hits}
    out = []
    for (_, _, op), g in ctx.per_site(r for r, _, _ in hits).items():
        sev, msg = info[id(g[0])]
        out.append(ctx.finding("pageable-copy", g[0], op, len(g) / ctx.n_steps, msg, severity=sev))
    return out
