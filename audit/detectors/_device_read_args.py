"""An op's Python-int argument that torch read from a device tensor passed where an int goes: host-sync's.

`probs[0, ids[0, -1]]` (transformers' ConfidenceCriteria) indexes with a 0-dim integer device tensor: torch's
indexing reads it with `.item()` (a `_local_scalar_dense` right before the op, at the same line) and hands
the int to `aten.select`. So does `x[:, :n]` with a 0-dim tensor bound, through Python's `__index__`. The
select's argument then changes with the data, but it is no host value: the code passed a device tensor, and
the one hazard is the read (a host-sync at that line, which capture refuses). Calling it a baked-host-value
too would give a second finding whose fix ("keep the value in a device tensor") the code already follows.
Only the read torch or Python makes for the op itself counts (the record just before it, at the same line);
an explicit `int(t)` or `.item()` the code writes is its own statement. A read of a tensor kept in host memory
is no host-sync (`_host.kept_on_host`): its value is a host value, and baked-host-value reports it.
"""

from __future__ import annotations

from audit.detectors._host import computes_on_host, kept_on_host

_READ = "aten._local_scalar_dense"


def _before(ctx, r, back: int):
    """The record `back` places before r in its step, or None."""
    recs = ctx.steps[r.step]
    j = r.index if r.index < len(recs) and recs[r.index] is r else next(
        (k for k, q in enumerate(recs) if q is r), None)
    if j is None or j - back < 0:
        return None
    return recs[j - back]


def _same_line(a, b) -> bool:
    return bool(a.frame and b.frame) and a.frame[:2] == b.frame[:2]


def _int_scalar(rec) -> bool:
    return bool(rec.inputs) and tuple(rec.inputs[0].shape) == () and not rec.inputs[0].dtype.is_floating_point


def read_for_op(ctx, r) -> bool:
    """r's non-tensor argument is a device value read for r itself: torch's indexing read of a 0-dim integer
    device index (a non-nested `_local_scalar_dense` right before r), or Python's `__index__` of a tensor
    slice bound (a host `Tensor.__index__` read, its nested `_local_scalar_dense`, then r), at r's line."""
    if r.kind != "aten" or r.nested:
        return False
    prev = _before(ctx, r, 1)
    if prev is None or prev.op != _READ or not _same_line(prev, r) or not _int_scalar(prev):
        return False
    if not prev.nested:
        return not computes_on_host(ctx, prev)
    host = _before(ctx, r, 2)
    return (host is not None and host.kind == "host" and host.op == "Tensor.__index__" and _same_line(host, r)
            and not kept_on_host(ctx, host))


def read_for_ops(ctx, recs) -> bool:
    """Every aligned call of the group took its changing argument from such a read."""
    return all(read_for_op(ctx, r) for r in recs)
