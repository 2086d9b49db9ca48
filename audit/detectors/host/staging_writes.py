"""Host buffers of any size the target keeps, as places the step writes host values into.

`host_tensors` keeps the counters and small host scalars (and pinned buffers of any size); a large pageable
attribute (xgrammar's int32 token bitmask `self.bitmask = torch.zeros(B, W, dtype=torch.int32)`, a `[B, V]`
bool mask a host matcher fills) is staging, whose send to the device is pageable-copy's finding. Writing host
values into it is host work all the same: `row[allowed] = True` or `bitmask[r, w] = v` copies no scalar to a
device and bakes no kernel argument (the later copy reads the buffer as it then is); the refill a replay skips
is the step's host work, not a device op. Only writes before the step sends that memory on with `.to(D)` count:
on a GPU what follows is the device copy.
"""

from __future__ import annotations

from audit.detectors.host import helper_alloc, kept as _host
from audit.scan.standins import pinned


def kept_pageable(ctx, small: dict) -> dict[int, str]:
    """Storage id -> 'owner.attr' of the tensor attributes (beyond the small ones) whose class makes them with a
    factory naming no device or the CPU, not pinned, while it puts other tensors on a device: host memory on a
    GPU too (a class that names no device anywhere keeps everything wherever the caller moves it)."""
    out = {sid: label for sid, label, name, obj, t in _host.cpu_attrs(ctx)
           if sid not in small and not pinned.asked(t) and _host.pageable_beside_device(obj, name)}
    out.update({sid: label for sid, label in helper_alloc.host_buffers(ctx).items() if sid not in small})
    return out


def staging_buffers(ctx) -> dict[int, str]:
    """Storage id -> 'owner.attr' of every host tensor the target keeps: host_tensors plus the large pageable
    staging attributes (kept_pageable). Computed once per scan."""
    if (cached := getattr(ctx, "_staging_buffers", None)) is None:
        small = _host.host_tensors(ctx)
        cached = ctx._staging_buffers = {**small, **kept_pageable(ctx, small)}
    return cached


def on_kept_host(ctx, r) -> bool:
    """`r`'s first operand (what an in-place op or index_put_ writes, what an index op reads) is a host buffer the
    target keeps, before the step sends that memory to the device (a CUDA scan sees the buffer's device)."""
    if not r.inputs:
        return False
    sid = r.inputs[0].sid
    if ctx.cuda:  # a host buffer the step itself allocated (pad_sequence's padded table) is no kept buffer
        return r.inputs[0].device.type == "cpu" and sid not in made_in_step(ctx, r.step)
    if sid not in staging_buffers(ctx):
        return False
    return _host.sent_at(ctx.steps[r.step]).get(sid, r.index + 1) > r.index


def made_in_step(ctx, step: int) -> set[int]:
    """Storage ids the step allocated: first met as an op's output, never before as an input (a kept buffer, or a
    view of one, is met as an input first). Computed once per step."""
    cache = ctx.__dict__.setdefault("_made_in_step", {})
    if step not in cache:
        seen, made = set(), set()
        for q in ctx.steps[step]:
            seen |= {m.sid for m in q.inputs}
            made |= {m.sid for m in q.outputs if m.sid not in seen}
            seen |= {m.sid for m in q.outputs}
        cache[step] = made
    return cache[step]
