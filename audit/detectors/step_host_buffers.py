"""Host buffers the step makes itself and fills from the device (CPU scans).

A library that wants sizes on the host (a grouped GEMM taking batch sizes as a CPU tensor) often writes
`host = torch.empty(E, dtype=torch.long, device="cpu"); host.copy_(counts)` instead of `counts.cpu()`.
On a GPU that copy_ is a device->host copy into pageable memory: it waits for the device, and capture
refuses it. On a CPU scan no tensor is on a device, so the copy looks like any other; the source says
where the destination lives; so does host data made a tensor in the step (`torch.from_numpy(self.np_buf)
.copy_(counts)` writes a numpy buffer). So does a buffer an object of the target keeps in pageable memory
(a KV swap space filled with `self.host[i].copy_(blk, non_blocking=True)`); the small host tensors a target
keeps on purpose (counters) are `device_values_into_host_tensors`'s.
"""

from __future__ import annotations

import ast

from audit.detectors import register
from audit.detectors.host import kept as _host, staging_writes
from audit.detectors.source import lookup
from audit.detectors.host.factories import follows_default

# factories whose tensor is in host memory when the call names no device (torch.zeros(n)) or the CPU
_PLAIN = set(lookup.HOST_FACTORIES)
# factories that follow another tensor's device unless the call names the CPU (torch.empty_like(t, device="cpu"))
_LIFTS = ("aten.lift_fresh", "aten.lift_fresh_copy")
_FOLLOWING = {"empty_like", "zeros_like", "ones_like", "full_like", "new_empty", "new_zeros", "new_ones",
              "new_full"}


def _host_buffer_call(filename: str, line: int) -> bool:
    """A factory call on `line` whose tensor is born in pageable host memory: a `torch.<factory>` naming
    no device or the CPU, or a `*_like` / `t.new_*` naming the CPU; never one asking for pinned memory."""
    for n in lookup._calls_on(filename, line, _PLAIN | _FOLLOWING):
        name = getattr(n.func, "attr", getattr(n.func, "id", ""))
        if any(k.arg == "pin_memory" and not (isinstance(k.value, ast.Constant) and not k.value.value)
               for k in n.keywords):
            continue
        dev = lookup._device_kw(n, filename)
        if dev is not None:
            if lookup._on_cpu(filename, dev):
                return True
        elif name in _PLAIN and isinstance(n.func, ast.Attribute) and ast.unparse(n.func.value) == "torch" \
                and not follows_default(filename, line):
            return True
    return False


def _step_host_buffers(recs) -> dict[int, object]:
    """Storage id -> the record that made it, for the host buffers made in one step: by a factory on the host,
    or lifted from host data (`torch.from_numpy(self.np_buf)`, `torch.tensor(rows)` naming no device)."""
    out = {r.inputs[0].sid: r for r in recs if r.kind == "aten" and r.inputs and r.op in _LIFTS}
    for sid in _host.built_on_device(recs):
        out.pop(sid, None)
    for r in recs:
        if (r.kind == "aten" and r.outputs and r.new and r.new[0] and r.stack
                and _host_buffer_call(r.stack[-1][0].co_filename, r.stack[-1][1])):
            out.setdefault(r.outputs[0].sid, r)
    return out


@register("host-sync")
def device_values_into_step_host_buffers(ctx):
    """(CPU scan) a host buffer made in the step by a factory that puts it in host memory takes a tensor
    computed on the device (`host.copy_(counts)`): a device->host copy into pageable memory on a GPU."""
    if ctx.cuda:
        return []
    hits = []
    for step, recs in enumerate(ctx.steps):
        bufs = _step_host_buffers(recs)
        if not bufs:
            continue
        host = _host.host_derived(recs, set(bufs) | _host.host_data(ctx, step) | _host.from_kept(ctx, step)
                                  | set(_host.host_tensors(ctx)))
        moved = _host.sent_at(recs)  # a buffer sent on with `.to(D)` (`torch.zeros(n).to(v)`) is on the device after
        hits += [r for i, r in enumerate(recs) if r.kind == "aten" and r.op == "aten.copy_" and len(r.inputs) >= 2
                 and not r.nested and r.inputs[0].sid in bufs and r.inputs[1].sid not in host
                 and moved.get(r.inputs[0].sid, i + 1) > i]
    return [ctx.finding("host-sync", g[0], op, len(g) / ctx.n_steps,
                        "copies a device tensor into a host buffer made in the step (a factory naming no device or "
                        "the CPU): on a GPU a device->host copy into pageable memory that waits for the device "
                        "(capture refuses it)",
                        fix="Keep the values on the device, or take the sizes from host metadata the step is given.")
            for (_, _, op, _), g in ctx.per_site(hits).items()]


@register("host-sync")
def device_values_into_kept_pageable_buffers(ctx):
    """(CPU scan) a host buffer an object of the target keeps in pageable memory (a class attribute made by a
    factory naming no device or the CPU and not pinned, beside tensors it puts on a device: a KV swap space
    `torch.zeros(n, block, d)`) takes a tensor computed on the device (`self.host[i].copy_(blk, non_blocking=True)`):
    on a GPU a device->host copy into pageable memory waits for the device, non_blocking or not, and capture
    refuses it. The small host tensors (counters, host scalars) are device_values_into_host_tensors's; a pinned
    buffer is a memcpy node; data computed from host tensors alone is no read."""
    if ctx.cuda:
        return []
    small = _host.host_tensors(ctx)
    kept = staging_writes.kept_pageable(ctx, small)
    hits = []
    for step, recs in enumerate(ctx.steps if kept else ()):
        host = _host.host_derived(recs, set(kept) | set(small) | _host.host_data(ctx, step))
        hits += [r for r in recs if r.kind == "aten" and r.op == "aten.copy_" and len(r.inputs) >= 2 and not r.nested
                 and r.inputs[0].sid in kept and r.inputs[1].sid not in host]
    return [ctx.finding("host-sync", g[0], op, len(g) / ctx.n_steps,
                        f"copies a device tensor into the host buffer `{kept[g[0].inputs[0].sid]}` (made in pageable "
                        "memory): on a GPU a device->host copy into pageable memory that waits for the device, even "
                        "with non_blocking=True (capture refuses it)",
                        fix="Make the host buffer pinned (pin_memory=True) and copy with non_blocking=True, or keep "
                            "the data on the device.")
            for (_, _, op, _), g in ctx.per_site(hits).items()]
