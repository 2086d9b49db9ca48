"""An index torch's own indexing read back from the device: the read is the hazard, not the value it passed on.

`x[i]` with `i` a 0-dim integer device tensor (`self.table[self.token]`, `ids[pick]` after a Categorical draw)
is turned into a Python int inside torch's indexing (`tensor.item()`, a dispatched `_local_scalar_dense`) and
then applied as `select(dim, int)`. host-sync reports the read at that line. The `select` argument that changes
with the data is the same value, read by torch and not written by the user as a Python number: its fix is
the read's fix (index with a [1]-shaped tensor, `index_select`, or gather), so baked-host-value does not report it
a second time. A Python int the user reads and passes on (`n = int(t)`, then `x[n]`) stays a baked value.
"""

from __future__ import annotations

import torch

__all__ = ["read_by_indexing"]

_APPLIED = ("aten.select",)  # what torch's indexing applies an integer index with (applySelect)


def _previous_op(ctx, r):
    """The aten record dispatched right before `r` in its step, or None."""
    recs = ctx.steps[r.step]
    i = r.index if r.index < len(recs) and recs[r.index] is r else next((j for j, x in enumerate(recs) if x is r), None)
    for j in range(i - 1, -1, -1) if i is not None else ():
        if recs[j].kind == "aten":
            return recs[j]
    return None


def _read_here(ctx, r) -> bool:
    """`r` applies an integer index that a dispatched (not user-hooked) read of a 0-dim integer tensor took on the
    same line just before it."""
    if r.op not in _APPLIED or not r.frame:
        return False
    prev = _previous_op(ctx, r)
    return (prev is not None and prev.op == "aten._local_scalar_dense" and not prev.nested and bool(prev.inputs)
            and tuple(prev.inputs[0].shape) == () and not prev.inputs[0].dtype.is_floating_point
            and prev.inputs[0].dtype not in (torch.bool, torch.complex64, torch.complex128)
            and prev.frame is not None and tuple(prev.frame[:2]) == tuple(r.frame[:2]))


def read_by_indexing(ctx, recs) -> bool:
    """Every aligned call of this site applies an index torch's indexing read from a 0-dim device tensor."""
    return all(_read_here(ctx, r) for r in recs)
