"""A changing argument that the step read back from the device on the same line: host-sync's, not baked.

Indexing with a 0-dim integer device tensor (`self.cos[self.pos]`, `buf[lo:hi]` with tensor bounds) makes
torch read the index back (`_local_scalar_dense`, the host-sync finding at that line) and pass the Python int
on to `select` / `slice`. That int changes as the position advances, yet it is no host value a capture
freezes: it is the device value itself, and the host-sync's fix (a `[1]`-shaped index, `index_select`) removes
both. A baked-host-value there would repeat the host-sync with a fix that does not apply (the code already
passes a device tensor). An int the code reads itself (`int(t)`, `t.item()`, even on the same line) is its own
Python value and stays a baked-host-value beside its read; so does Python's `__index__` of a slice bound
count as torch's read (`x[:, :n]`, n a 0-dim tensor: the bound's dynamic-shape stands). So does a size torch
derives inside one op from the largest index it read back (`F.one_hot(ids)` without `num_classes` reads
`ids.max()` and makes `zeros([..., max + 1])`): the changing size is the device value's, the host-sync's.

A read of a tensor that lives in host memory on a GPU too (a host counter `self.pos = torch.tensor(0)`, what
the step computed from host data: `host/kept.py`'s `kept_on_host`) waits for nothing and is no host-sync: its value is a
host value a capture freezes, and baked-host-value reports it.

The values come from the read's 0-dim input where the scan saw it (a CPU tensor: `host_scalars`); where it
did not (a device tensor on a CUDA scan), a read of a 0-dim integer tensor at the same line right before the
op stands for it.
"""

from __future__ import annotations

from audit.detectors.host.kept import kept_on_host

__all__ = ["read_back_on_line"]

_READ = "aten._local_scalar_dense"


def _changing(recs) -> list[int]:
    """Positions of the arguments that differ between the aligned calls (all of one length)."""
    args = [r.args for r in recs]
    if any(len(a) != len(args[0]) for a in args):
        return []
    return [i for i in range(len(args[0])) if len({repr(a[i]) for a in args}) > 1]


def _by_torch(recs, j: int) -> bool:
    """recs[j], a read, is one torch made for the op: its indexing's own (dispatched from C++, not nested in a
    host call) or Python's `__index__` of a tensor slice bound; not an `int(t)` / `.item()` the code wrote."""
    if not recs[j].nested:
        return True
    return j > 0 and recs[j - 1].kind == "host" and recs[j - 1].op == "Tensor.__index__"


def _reads_before(ctx, r) -> list:
    """The device reads made at r's line in r's step before r, nearest first, up to the previous op of
    another line."""
    out, recs = [], ctx.steps[r.step]
    at = r.index if r.index < len(recs) and recs[r.index] is r else next((k for k, q in enumerate(recs) if q is r), None)
    if r.frame is None or at is None:
        return out
    for j in range(at - 1, -1, -1):
        p = recs[j]
        if p.frame != r.frame:
            break
        if p.op == _READ and p.inputs and not p.inputs[0].shape and not kept_on_host(ctx, p) and _by_torch(recs, j):
            out.append(p)
    return out


def _explained(ctx, r, positions, dims) -> bool:
    reads = _reads_before(ctx, r)
    if not reads:
        return False
    values = [dict(p.host_scalars).get(0) for p in reads]
    if any(v is None for v in values):  # not seen (a device tensor): the read right before stands for it
        return not reads[0].inputs[0].dtype.is_floating_point and not reads[0].inputs[0].dtype.is_complex
    return all(_from_read(r.args[i], dims.get(i), values) for i in positions)


def _varying_dims(recs, i: int) -> list[int] | None:
    """For a size-list argument at position i: the indices of its ints that differ between the aligned calls
    (None when it is not a list of one length in every call)."""
    lists = [r.args[i] for r in recs]
    if not all(isinstance(x, (list, tuple)) and len(x) == len(lists[0]) for x in lists):
        return None
    return [k for k in range(len(lists[0])) if len({repr(x[k]) for x in lists}) > 1]


def _from_read(arg, dims, values) -> bool:
    """`arg` is a value read back (an int among `values`), or a size list whose varying ints (`dims`) are each
    one of them or one past it (a count sized `max + 1`, as one_hot makes it)."""
    if isinstance(arg, int):
        return arg in values
    if not dims:
        return False
    return all(isinstance(arg[k], int) and (arg[k] in values or arg[k] - 1 in values) for k in dims)


def read_back_on_line(ctx, recs) -> bool:
    """Every changing argument of the aligned calls is, in each step, a value the same line read back from a
    0-dim device tensor just before the call."""
    if recs[0].args and recs[0].args[0] == "value":
        return False  # a tensor built from host data
    positions = _changing(recs)
    dims = {i: _varying_dims(recs, i) for i in positions}
    return bool(positions) and all(_explained(ctx, r, positions, dims) for r in recs)
