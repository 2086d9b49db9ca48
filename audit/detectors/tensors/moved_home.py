"""Allocations copied to the host in the step that made them: on a GPU the state keeps the host copy.

torchmetrics' `compute_on_cpu=True` appends each update's device tensor to a list state, then rebinds the list
to `[v.to("cpu") for v in vals]`. On a CPU scan `.to("cpu")` returns the tensor itself, so the next step's
`.to("cpu")` of the held element read like a later step reading a device allocation (step-allocation,
silent). On a GPU the list holds the host copy the first `.to` made, and the later `.to` of it reads host
memory (a no-op): the device tensor never escaped. The copy is the host-sync's finding. Any other later
read of it (a device op) still counts as the escape.
"""

from __future__ import annotations

_COPIES = ("Tensor.cpu", "Tensor.to")


def host_copies(ctx) -> set:
    """ids of the records that copy a tensor to the host on a GPU (`.cpu()`, and the `.to(<cpu>)` host-sync
    keeps); computed once."""
    if (got := getattr(ctx, "_host_copies", None)) is None:
        from audit.detectors.host_sync import to_host

        keep = to_host(ctx)
        got = ctx._host_copies = {id(r) for recs in ctx.steps for r in recs if r.kind == "host" and r.op in _COPIES
                                  and (r.note != "cpu?" or id(r) in keep)}
    return got


def moved_home(ctx) -> set:
    """(step, storage id) of the allocations a host copy read in the step that made them."""
    copies, born = host_copies(ctx), ctx.trace.born
    return {(s, m.sid) for s, recs in enumerate(ctx.steps) for r in recs if id(r) in copies
            for m in r.inputs if born.get(m.sid, (None,))[0] == s}


def rereads_host_copy(ctx, r, sid: int, alloc_step: int, moved: set) -> bool:
    """`r`, in a later step, copies to the host an allocation its own step already copied there: on a GPU it
    reads that host copy, not the device allocation."""
    return (alloc_step, sid) in moved and id(r) in host_copies(ctx)
