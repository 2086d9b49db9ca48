"""Ops a torch composite picks by shape or layout, inside one statement: no branch of the step's code.

`q @ k.transpose(-1, -2)` runs aten.matmul's Python-free decomposition, whose `reshape` is a `view` when the
operand's strides allow it and a `clone` + `_unsafe_view` when they do not; `x.reshape(...)`, `x.contiguous()`
and broadcasting ops choose the same way. When a dynamic shape flows into such a statement (a verify step fed
1 to 3 pending tokens: `[2, 4, 1, 8]` is viewable, `[2, 4, 3, 8]` transposed is not) the two steps' op sequences
fork at that statement although no Python branch decided anything: the varying shape is the hazard, reported
as dynamic-shape (or baked-host-value) where it starts, and the fork it causes is no data-dependent-control.
The same holds for inputs of one shape and other strides: after a Python branch picks one of two kernels
(a gated-delta-rule layer taking the chunked reference past a context length, the recurrent one before), the
output of one arm is contiguous and the other's a transposed view, so the next `o.reshape(...)` is a `view` in
one step and a `clone` in the other; the branch is the fork, reported at its `if`, and the reshape follows it.

An assignment through an index (`y[idx] += v`, `x[a:b] = v`) first strips the value's leading size-1 dims with a
`view` when it has any: the rows an expert got from a `nonzero` are one in some steps and two in others, so one
step runs `view` + `index_put_` and the next `index_put_` alone. That `view` launches nothing and follows the
row count, so it is left out of the sequences the steps are compared on.
"""

from __future__ import annotations

__all__ = ["picked_by_layout", "without_prefix_views"]

_SETITEM_WRITES = frozenset({"aten.index_put_", "aten.index_put", "aten.copy_"})


def picked_by_layout(tag, ra, rb, i1, i2, j1, j2) -> bool:
    """A replaced region whose ops, on both sides, were all issued by one statement (the same frames, which
    the next op of each side still runs in: the statement goes on), and whose first ops read inputs of other
    shapes, or of the same shapes in other layouts, in the two steps."""
    if tag != "replace":
        return False
    ea, eb = ra[i1:i2], rb[j1:j2]
    if not ea or not eb or i2 >= len(ra) or j2 >= len(rb):
        return False
    stack = ea[0].stack
    if not stack or any(r.stack != stack for r in (*ea, *eb, ra[i2], rb[j2])):
        return False
    return [(tuple(m.shape), tuple(m.stride)) for m in ea[0].inputs] != \
        [(tuple(m.shape), tuple(m.stride)) for m in eb[0].inputs]


def _strips_leading_ones(r) -> bool:
    if not r.inputs or not r.outputs:
        return False
    shape, out = tuple(r.inputs[0].shape), tuple(r.outputs[0].shape)
    k = len(shape) - len(out)
    return k > 0 and shape[k:] == out and all(d == 1 for d in shape[:k])


def without_prefix_views(recs: list) -> list:
    """`recs` without the `view`s an indexed assignment makes of its value (leading size-1 dims dropped), which
    the write right after it, issued by the same statement, consumes."""
    return [r for k, r in enumerate(recs)
            if not (r.op == "aten.view" and k + 1 < len(recs) and recs[k + 1].op in _SETITEM_WRITES
                    and recs[k + 1].stack == r.stack and _strips_leading_ones(r))]
