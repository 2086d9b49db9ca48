"""Host data the step builds and reads back on the host alone: no value a graph would bake.

`lens = torch.tensor([len(r) for r in reqs]); n = max(lens.tolist())`, or segment offsets
`torch.cumsum(torch.tensor(seg_lens), 0).tolist()` (S-LoRA / punica style), build a tensor from changing Python
data, but no device op, copy or `.to(D)` ever takes it or what the host computes from it. Capture records no
kernel for it; what the host does with the Python values it reads back is judged where they go (a changing
scalar argument of a device op is baked at that op, a changed attribute is a cpu-side-effect). So the
baked-host-value rule skips such a `torch.tensor(...)`, and dynamic-shape skips it when its length changes.
It is baked as soon as anything made from it meets device data (an operand of a device op, an index into a
device tensor, a copy into a device buffer), and data built straight onto the device (`device=x.device`) is
device memory, not host data. A write into a host tensor the target keeps on purpose (a pinned slot-mapping
staging buffer refilled with `self.slot_cpu[b] = blk * BS + off`, a host counter) is no such meeting: a replay's
memcpy reads the buffer's memory, not the value, and the refill is cpu-side-effect's finding (what a device op
later takes from a host counter is baked at that use).
"""

from __future__ import annotations

from audit.detectors.source import lookup
from audit.detectors.host.staging_writes import on_kept_host
from audit.detectors.host.kept import (built_on_device, computes_on_host, factory_born, from_kept, host_data,
                                       host_derived, host_tensors)

LIFTS = ("aten.lift_fresh", "aten.lift_fresh_copy")


def stays_on_host(ctx, lifted) -> bool:
    """For the records of one call site (one per step): in every step, the tensor it made and all that ops
    computed from it alone meet no other tensor in an op, and are neither sent with `.to(D)` nor copied into
    another tensor, except a host tensor the target keeps (written in host memory: no kernel takes the value)."""
    kept = host_tensors(ctx)
    for r in lifted:
        recs = ctx.steps[r.step]
        host = host_data(ctx, r.step) | from_kept(ctx, r.step)
        if not r.inputs or r.inputs[0].sid in built_on_device(recs):
            return False
        born = host_derived(recs, {r.inputs[0].sid})
        for q in recs:
            ins = [m.sid for m in q.inputs]
            if q is r or not any(s in born for s in ins):
                continue
            if q.kind == "host" and q.note == "cpu?" and q.stack and \
                    not lookup.names_cpu(q.stack[-1][0].co_filename, q.stack[-1][1]):
                return False  # `.to(D)`: sent to the device (pageable-copy's finding, baked too)
            if q.kind == "aten" and q.op.endswith("_") and ins[0] in kept and all(s in born for s in ins[1:]):
                continue  # written into a kept host buffer (staging, counter): the buffer is what moves on
            if q.kind == "aten" and q.op.endswith("_") and ins[0] not in born and on_kept_host(ctx, q) and \
                    all(s in born or s in host for s in ins[1:]):
                continue  # the same into a large pageable staging buffer (a token bitmask), beside other host data
            if q.kind == "aten" and any(s not in born for s in ins):
                return False  # meets a device tensor (or is copied into one)
            if q.kind == "aten" and q.op.endswith("_") and q.inputs and q.inputs[0].sid not in born:
                return False
    return True


def lifts_on_host(ctx, items) -> bool:
    """Every record of every group is a lift of host data that stays on the host (stays_on_host)."""
    return all(r.op in LIFTS for rs in items for r in rs) and all(stays_on_host(ctx, rs) for rs in items)


def host_work_stays(ctx, recs) -> bool:
    """For the records of one call site (one per step): each is CPU work on host data (a torch factory on the
    host, `torch.ones(h, w)`, or an op whose tensor inputs all live in host memory) and, in every step, what it
    made and what ops computed from that meet no device tensor, are not sent with `.to(D)` and are not copied
    into a device tensor. A grid sized per request and read back on the host alone (`int(torch.ones(h,
    w).sum())`) is no kernel a graph holds: its changing shape and arguments are nobody's finding."""
    for r in recs:
        steps = ctx.steps[r.step]
        if not r.outputs or not (r.outputs[0].sid in _factories(ctx, r.step) or computes_on_host(ctx, r)):
            return False
        host = host_data(ctx, r.step) | from_kept(ctx, r.step)
        mine = {m.sid for m in r.outputs}  # what it made, and what ops made from that and other host data
        for q in steps[r.index + 1:] if steps[r.index] is r else steps:
            ins = [m.sid for m in q.inputs]
            if not any(s in mine for s in ins):
                continue
            if q.kind == "host" and q.note == "cpu?" and q.stack and \
                    not lookup.names_cpu(q.stack[-1][0].co_filename, q.stack[-1][1]):
                return False  # sent to the device
            if q.kind == "aten" and any(s not in host and s not in mine for s in ins):
                return False  # meets a device tensor (or is copied into one)
            if q.kind == "aten":
                mine |= {m.sid for m in q.outputs}
    return True


def _factories(ctx, step: int) -> set:
    cache = ctx.__dict__.setdefault("_factory_born", {})
    if step not in cache:
        cache[step] = factory_born(ctx.steps[step])
    return cache[step]


def shape_stays_on_host(ctx, recs) -> bool:
    """For the records of one call site (one per step) whose output shape varies: each made host memory, and in
    every step what it made, and what host ops computed from that, reaches the device (sent with `.to(D)`, an
    operand of an op with a device tensor, copied into a device buffer) at the same places with the same shapes.
    A per-request logit bias densified on the host (`torch.sparse_coo_tensor(torch.tensor([keys]),
    torch.tensor(vals), (V,)).to_dense().to(D)`) lifts lists of another length each step, but only the [V] row
    meets the device: the varying shapes are CPU work no graph records, and the row it sends is the
    pageable-copy (and baked-host-value) at the sending line."""
    exits = []
    for r in recs:
        steps = ctx.steps[r.step]
        host = host_data(ctx, r.step) | from_kept(ctx, r.step)

        def on_host(m) -> bool:
            return m.device.type == "cpu" if ctx.cuda else m.sid in host
        if not r.outputs or not all(on_host(m) for m in r.outputs):
            return False
        mine, seen = {m.sid for m in r.outputs}, []
        for q in steps[r.index + 1:] if steps[r.index] is r else steps:
            hit = [m for m in q.inputs if m.sid in mine]
            if not hit or not q.stack:
                continue
            shapes = (q.stack[-1][1], q.op, tuple(tuple(m.shape) for m in hit))
            if q.kind == "host" and q.note == "cpu?" and not lookup.names_cpu(q.stack[-1][0].co_filename,
                                                                                 q.stack[-1][1]):
                seen.append(shapes)  # sent to the device
            elif q.kind == "aten" and any(m.sid not in mine and not on_host(m) for m in q.inputs):
                seen.append(shapes)  # meets a device tensor (or is copied into one)
            elif q.kind == "aten":
                mine |= {m.sid for m in q.outputs}
        exits.append(seen)
    return all(e == exits[0] for e in exits)
