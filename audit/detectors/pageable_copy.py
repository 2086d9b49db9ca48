"""pageable-copy (CUDA scans): host->device copies inside the step.

Capture raises on a copy between pageable host memory and the device ("unless the CPU tensor is
pinned"); a pinned copy with non_blocking=True is captured as a memcpy node, which is the right way
to stage data only if the pinned buffer is persistent and refilled outside the graph. A blocking
device->host copy is a host-sync finding (its message names the pageable destination): one read,
one finding.
"""

from __future__ import annotations

from audit.detectors import register
from audit.detectors._host import host_made
from audit.detectors.host_sync import (INDEX_PUT, copy_sides, from_host_data, host_index, host_scalar_put,
                                       lifted_here, masked_fill_dispatch, non_blocking)

PINNED = ("pinned host->device copy inside the step (captured as a memcpy node; the pinned buffer must be "
          "persistent and refilled in prepare())")
PINNED_BACK = ("non-blocking device->host copy into pinned memory inside the step (captured as a memcpy node; "
               "read the host buffer only after the replay has been synchronized)")
PAGEABLE = ("host->device copy from pageable memory: capture raises 'Cannot copy between CPU and CUDA tensors "
            "... unless the CPU tensor is pinned'")
HOST_INDEX = ("a host index tensor indexes a device tensor: the op first copies the index from pageable host memory "
              "to the device (capture raises 'Cannot copy between CPU and CUDA tensors ...'; eager decode waits)")
FROM_DATA = ("torch.tensor(data, device=...) inside the step copies Python data from pageable host memory to "
             "the device (and bakes its value)")


@register("pageable-copy", cuda_only=True)
def host_device_copies(ctx):
    """Host->device copies: blocking when pageable, info when pinned (and pinned non-blocking reads back)."""
    hits = []
    for r in ctx.all_records():
        sides = copy_sides(r)
        if not sides:
            continue
        src, dst = sides
        if {src.device.type, dst.device.type} != {"cpu", "cuda"}:
            continue
        if src.device.type == "cpu":
            hits.append((r, "info", PINNED) if src.pinned else (r, "blocks-capture", PAGEABLE))
        elif dst.pinned and non_blocking(r) and not r.nested:
            hits.append((r, "info", PINNED_BACK))
    for r in ctx.all_records():
        if from_host_data(r):
            hits.append((r, "blocks-capture", FROM_DATA))
        elif host_index(r) and not r.nested:
            hits.append((r, "blocks-capture", HOST_INDEX))
    info = {id(r): (sev, msg) for r, sev, msg in hits}
    out = []
    for (_, _, op), g in ctx.per_site(r for r, _, _ in hits).items():
        sev, msg = info[id(g[0])]
        out.append(ctx.finding("pageable-copy", g[0], op, len(g) / ctx.n_steps, msg, severity=sev))
    return out


SCALAR_PUT = ("`x[idx] = <Python scalar>` through an index tensor: index_put_ first copies the scalar from pageable "
              "host memory to the device (capture raises 'Cannot copy between CPU and CUDA tensors ...'; eager "
              "decode waits for the copy)")
SCALAR_PUT_FIX = ("Use x.index_fill_(dim, idx, value) (the scalar travels as a kernel argument), or assign a device "
                  "tensor made once outside the step (`x[idx] = self.zero`).")


@register("pageable-copy")
def scalar_value_puts(ctx):
    """Both scans: the hidden copy of a Python scalar assigned through an index tensor (host_sync.host_scalar_put;
    a bool mask with a host scalar becomes masked_fill_ and copies nothing)."""
    hits = []
    for r in ctx.all_records(("aten",)):
        if r.op not in INDEX_PUT or r.nested or not r.frame or r.inputs[0].sid in host_made(ctx, r.step):
            continue
        here = lifted_here(ctx, r)
        if not masked_fill_dispatch(r, here, ctx.cuda) and host_scalar_put(r, here, ctx.cuda):
            hits.append(r)
    return [ctx.finding("pageable-copy", g[0], op, len(g) / ctx.n_steps, SCALAR_PUT, fix=SCALAR_PUT_FIX)
            for (_, _, op), g in ctx.per_site(hits).items()]
