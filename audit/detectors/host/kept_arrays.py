"""A numpy array the target keeps, wrapped in the step and sent on as it is: no value a graph would bake.

`torch.from_numpy(self.mask_np).to(D)` (a grammar bitmask built on the host, `self.mask_np[:] = ...` in
prepare()) makes a tensor over the array's own memory: a copy of it, in eager or in a replay, reads that
memory when it runs, so the values prepare() wrote there are what it sends. Nothing is frozen; the send is
the pageable-copy (pinned memory is the fix, and a pinned buffer's numpy view is already no finding). Two
things still bake: host work on the wrap before the send (`torch.from_numpy(self.ban).long()` makes new host
data with this step's values, which the copy then reads), and an array bound anew each step (another address
each step: a graph's copy keeps reading the captured one). The tracer notes the wraps of kept arrays
(`audit/scan/patches/zero_copy.py`); this module reads what came after them.
"""

from __future__ import annotations

from audit.scan.tracer import KEPT_ARRAY

__all__ = ["sent_as_is"]

_MOVES = ("Tensor.to", "Tensor.cuda")  # host records of a move (`Tensor.to(non_blocking=True)` too, not `tolist`)


def sent_as_is(ctx, recs) -> bool:
    """For the records of one lift site (one per step): each wraps a kept array (the tracer's note), at the
    same address in every step, and the first thing that takes the wrap in its step moves it (`.to(D)`,
    `.cuda()`, a copy into a buffer), not a host op deriving new data from it."""
    if not all(r.note == KEPT_ARRAY and r.outputs for r in recs):
        return False
    if len({r.outputs[0].ptr for r in recs}) > 1:
        return False  # bound anew: the captured address is not the one prepare() refills
    return all(_moved_first(ctx, r) for r in recs)


def _moved_first(ctx, lift) -> bool:
    sid = lift.outputs[0].sid
    for r in ctx.steps[lift.step][lift.index + 1:]:
        if not any(m.sid == sid for m in r.inputs):
            continue
        if r.kind == "host":
            return r.op.split("(")[0] in _MOVES
        if r.op == "aten.copy_":
            return len(r.inputs) > 1 and r.inputs[1].sid == sid and r.inputs[0].sid != sid  # copied into a buffer
        if r.op == "aten._to_copy":  # a CUDA scan's `.to(D)`: a move when it names a device other than the host
            return any(isinstance(a, tuple) and a[:1] == ("device",) and "cpu" not in str(a[1]) for a in r.args)
        return False
    return True  # nothing took it: no kernel either
