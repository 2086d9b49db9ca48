"""pageable-copy (CUDA scans): host->device copies inside the step.

Capture raises on a copy between pageable host memory and the device ("unless the CPU tensor is
pinned"); a pinned copy with non_blocking=True is captured as a memcpy node, which is the right way
to stage data only if the pinned buffer is persistent and refilled outside the graph. A blocking
device->host copy is a host-sync finding (its message names the pageable destination): one read,
one finding.
"""

from __future__ import annotations

from audit.detectors import register
from audit.detectors.source import lookup
from audit.detectors.host.kept import from_kept, host_data, host_made
from audit.detectors.host.step_copies import made_on_host
from audit.detectors.host.staging_writes import on_kept_host
from audit.detectors.host_sync import (INDEX_PUT, SCALAR_COPIED, copy_sides, from_host_data, host_index,
                                       host_scalar_put, lifted_here, masked_fill_dispatch, non_blocking,
                                       scalar_operand_copy)

PINNED = ("pinned host->device copy inside the step (captured as a memcpy node; the pinned buffer must be "
          "persistent and refilled in prepare())")
PINNED_BACK = ("non-blocking device->host copy into pinned memory inside the step (captured as a memcpy node; "
               "read the host buffer only after the replay has been synchronized)")
PAGEABLE = ("host->device copy from pageable memory: capture raises 'Cannot copy between CPU and CUDA tensors "
            "... unless the CPU tensor is pinned'")
HOST_INDEX = ("a host index tensor indexes a device tensor: the op first copies the index from pageable host memory "
              "to the device (capture raises 'Cannot copy between CPU and CUDA tensors ...'; eager decode waits)")
PINNED_STEP = ("host data built in the step is pinned in the step and copied to the device: on a GPU the copy is "
               "captured reading a pinned buffer filled once, with the Python data of the captured step (which the "
               "allocator may hand out again), so every replay uploads those stale bytes")
FROM_DATA = ("torch.tensor(data, device=...) inside the step copies Python data from pageable host memory to "
             "the device (and bakes its value)")


@register("pageable-copy", cuda_only=True)
def host_device_copies(ctx):
    """Host->device copies: blocking when pageable, info when pinned (and pinned non-blocking reads back), silent
    corruption when the step pinned the source itself (`torch.tensor(vals, pin_memory=True).to(dev)`: a replay
    copies the bytes of the captured step from a buffer the host allocator may have handed out again)."""
    hits = []
    for r in ctx.all_records():
        sides = copy_sides(r)
        if not sides:
            continue
        src, dst = sides
        if {src.device.type, dst.device.type} != {"cpu", "cuda"}:
            continue
        if src.device.type == "cpu" and src.pinned:  # its storage made in this step, or a persistent buffer
            made = ctx.trace.born.get(src.sid, (None,))[0] == r.step
            hits.append((r, "silent-corruption", PINNED_STEP) if made else (r, "info", PINNED))
        elif src.device.type == "cpu":
            hits.append((r, "blocks-capture", PAGEABLE))
        elif dst.pinned and non_blocking(r) and not r.nested:
            hits.append((r, "info", PINNED_BACK))
    for r in ctx.all_records():
        if from_host_data(r):
            hits.append((r, "blocks-capture", FROM_DATA))
        elif host_index(r) and not r.nested and (ctx.cuda or not on_kept_host(ctx, r)):
            hits.append((r, "blocks-capture", HOST_INDEX))
    info = {id(r): (sev, msg) for r, sev, msg in hits}
    out = []
    for (_, _, op, _), g in ctx.per_site(r for r, _, _ in hits).items():
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
        if not ctx.cuda and r.inputs[0].sid in host_data(ctx, r.step) | from_kept(ctx, r.step):
            continue  # a host row filled on the host (`row = torch.zeros(V); row[idx] = 1.0`): nothing goes to a device
        if not ctx.cuda and on_kept_host(ctx, r):
            continue  # into a host buffer the target keeps (`self.host_mask[b][allowed] = True`): host work
        here = lifted_here(ctx, r)
        if not masked_fill_dispatch(r, here, ctx.cuda) and host_scalar_put(r, here, ctx.cuda):
            hits.append(r)
    return [ctx.finding("pageable-copy", g[0], op, len(g) / ctx.n_steps, SCALAR_PUT, fix=SCALAR_PUT_FIX)
            for (_, _, op, _), g in ctx.per_site(hits).items()]


SCALAR_OPERAND = ("`{op}` takes a 0-dim host tensor beside device tensors: torch first copies it to the device from "
                  "pageable host memory (`.to(device)` inside the op; eager decode waits for the copy, and capture "
                  "raises 'Cannot copy between CPU and CUDA tensors ...')")
SCALAR_OPERAND_FIX = ("Pass a Python number (`torch.where(m, x, -1e4)`: it travels as a kernel argument), or a 0-dim "
                      "tensor made on the device once outside the step.")


def _sent(ctx, step: int) -> set:
    """(CPU scan) storage ids that a `.to(D)` of the step sends to the step's device (D not written as the CPU):
    on a GPU the operand is the device copy (`torch.tensor(0.0).to(x.device)`: that copy is the finding)."""
    cache = ctx.__dict__.setdefault("_sent_to_device", {})
    if step not in cache:
        cache[step] = {r.inputs[0].sid for r in ctx.steps[step] if r.kind == "host" and r.note == "cpu?" and r.inputs
                       and r.stack and not lookup.names_cpu(r.stack[-1][0].co_filename, r.stack[-1][1])}
    return cache[step]


@register("pageable-copy")
def scalar_operands(ctx):
    """Both scans: `torch.where(mask, x, torch.tensor(-1e4))` on device tensors. Where binary ops take a 0-dim
    CPU tensor as a kernel argument, where() moves it to the device with a copy. A CPU scan knows the host
    tensor by where it came from (host data or a host factory in the step, a tensor the target keeps on the
    host: host/kept.py: host_data, from_kept) and the device side by an operand that came from neither."""
    hits = []
    for r in ctx.all_records(("aten",)):
        if r.op not in SCALAR_COPIED or r.nested or not r.frame:
            continue
        if ctx.cuda:
            hit = scalar_operand_copy(r)
        else:
            host = (host_data(ctx, r.step) | from_kept(ctx, r.step)) - _sent(ctx, r.step)
            hit = any(not m.shape and m.sid in host for m in r.inputs) and \
                any(m.shape and m.sid not in host for m in r.inputs)
        if hit:
            hits.append(r)
    return [ctx.finding("pageable-copy", g[0], op, len(g) / ctx.n_steps, SCALAR_OPERAND.format(op=op.split(".")[-1]),
                        fix=SCALAR_OPERAND_FIX, severity="blocks-capture")
            for (_, _, op, _), g in ctx.per_site(hits).items()]


COPIED_BACK = ("copies back to the device a host copy the step made at {at} (`.cpu()` makes pageable host memory on a "
               "GPU): capture raises 'Cannot copy between CPU and CUDA tensors ... unless the CPU tensor is pinned', "
               "and eager decode waits for both copies")
COPIED_BACK_FIX = ("Keep the copy on the device (`p.detach().clone()`), or in a pinned buffer made once outside the step "
                   "and filled with `copy_(..., non_blocking=True)`.")


@register("pageable-copy")
def host_copies_sent_back(ctx):
    """CPU scans: a host copy the step made itself (`[p.detach().cpu().clone() for p in ps]`, diffusers' EMA
    `store()`) copied into device memory (`param.data.copy_(c)` in `restore()`) or sent with `.to(D)`. A CUDA scan
    sees the copy itself."""
    if ctx.cuda:
        return []
    hits, at = [], {}
    for r in ctx.all_records(("aten", "host")):
        if r.nested or not r.frame or not r.inputs:
            continue
        host = made_on_host(ctx, r.step)
        if r.kind == "aten" and r.op == "aten.copy_" and len(r.inputs) > 1:
            src, dst = r.inputs[1].sid, r.inputs[0].sid
            hit = src in host and dst not in host and src not in _sent(ctx, r.step) and \
                dst not in host_data(ctx, r.step) | from_kept(ctx, r.step)  # `copy_(c.to(D))`: the `.to` is the copy
        else:
            src = r.inputs[0].sid
            hit = src in host and src in _sent(ctx, r.step) and r.op == "Tensor.to"
        if hit:
            hits.append(r)
            at[id(r)] = host[src]
    return [ctx.finding("pageable-copy", g[0], op, len(g) / ctx.n_steps,
                        COPIED_BACK.format(at=f"{ctx.rel(at[id(g[0])][0])}:{at[id(g[0])][1]}"),
                        fix=COPIED_BACK_FIX, severity="blocks-capture")
            for (_, _, op, _), g in ctx.per_site(hits).items()]
