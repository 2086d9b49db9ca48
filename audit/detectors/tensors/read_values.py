"""A changing argument that the step read back from the device on the same line: host-sync's, not baked.

Indexing with a 0-dim integer device tensor (`self.cos[self.pos]`, `buf[lo:hi]` with tensor bounds) makes
torch read the index back (`_local_scalar_dense`, the host-sync finding at that line) and pass the Python int
on to `select` / `slice`. That int changes as the position advances, yet it is no host value a capture
freezes: it is the device value itself, and the host-sync's fix (a `[1]`-shaped index, `index_select`) removes
both. A baked-host-value there would repeat the host-sync with a fix that does not apply (the code already
passes a device tensor). An int the code reads itself (`int(t)`, `t.item()`, even on the same line) is its own
Python value and stays a baked-host-value beside its read; so does Python's `__index__` of a slice bound
count as torch's read (`x[:, :n]`, n a 0-dim tensor: the bound's dynamic-shape stands).

A read of a tensor that lives in host memory on a GPU too (a host counter `self.pos = torch.tensor(0)`, what
the step computed from host data: `host/kept.py`'s `kept_on_host`) waits for nothing and is no host-sync: its value is a
host value a capture freezes, and baked-host-value reports it.

The values come from the read's 0-dim input where the scan saw it (a CPU tensor: `host_scalars`); where it
did not (a device tensor on a CUDA scan), a read of a 0-dim integer tensor at the same line right before the
op stands for it.

An end torch derives from its own read counts too: `buf.narrow(1, pos, 1)` with `pos` a 0-dim device tensor
reads `pos` inside the composite (no `__index__`) and slices `[pos, pos + 1)`; the end changes with the read
start, by the same length in every step. Only a read torch's own composite made counts for this (a slice bound
read through `__index__` beside another bound is two values of the code's own).

A float goes the same way: a 0-dim device tensor passed where a Scalar goes (`torch.full_like(x[:, :1], amax /
127)`, `torch.add(x, y, alpha=t)`) is read back by torch's argument parsing, and the value the op takes is
that read; the fix (a tensor operand: `amax.expand(...)`, `x + y * t`) removes both.

A size torch derives from its own read counts as well: `F.one_hot(ids)` without `num_classes` reads `ids.max()`
and allocates `zeros([*ids.shape, max + 1])`; the size's changing element is the read value plus one (a count of
classes from the largest index), and the one finding is the host-sync at that line (with the dynamic-shape).
"""

from __future__ import annotations

from audit.detectors.host.kept import kept_on_host

__all__ = ["read_back_on_line"]

_READ = "aten._local_scalar_dense"


def _changing(recs) -> dict:
    """Positions of the arguments that differ between the aligned calls (all of one length) -> the positions of
    the elements that differ where the argument is a list of one length in every call (else None)."""
    args = [r.args for r in recs]
    if any(len(a) != len(args[0]) for a in args):
        return {}
    out = {}
    for i in range(len(args[0])):
        if len({repr(a[i]) for a in args}) > 1:
            seqs = [a[i] for a in args]
            same = all(isinstance(q, (list, tuple)) and len(q) == len(seqs[0]) for q in seqs)
            out[i] = [k for k in range(len(seqs[0])) if len({repr(q[k]) for q in seqs}) > 1] if same else None
    return out


def _by_torch(recs, j: int) -> bool:
    """recs[j], a read, is one torch made for the op: its indexing's own (dispatched from C++, not nested in a
    host call) or Python's `__index__` of a tensor slice bound; not an `int(t)` / `.item()` the code wrote."""
    if not recs[j].nested:
        return True
    return j > 0 and recs[j - 1].kind == "host" and recs[j - 1].op == "Tensor.__index__"


def _reads_before(ctx, r) -> list:
    """The device reads made at r's line in r's step before r, nearest first, up to the previous op of
    another line; each with whether Python's `__index__` made it."""
    out, recs = [], ctx.steps[r.step]
    at = r.index if r.index < len(recs) and recs[r.index] is r else next((k for k, q in enumerate(recs) if q is r), None)
    if r.frame is None or at is None:
        return out
    for j in range(at - 1, -1, -1):
        p = recs[j]
        if p.frame != r.frame:
            break
        if p.op == _READ and p.inputs and not p.inputs[0].shape and not kept_on_host(ctx, p) and _by_torch(recs, j):
            out.append((p, j > 0 and recs[j - 1].op == "Tensor.__index__"))
    return out


def _explained(ctx, r, positions) -> tuple[set, bool] | None:
    """The changing positions of r's arguments that are read values, and whether every read was made by a torch
    composite itself (not through `__index__`); None where the line read nothing that can explain them."""
    found = _reads_before(ctx, r)
    if not found:
        return None
    reads, own = [p for p, _ in found], not any(via_index for _, via_index in found)
    values = [dict(p.host_scalars).get(0) for p in reads]
    if any(v is None for v in values):  # not seen (a device tensor): the read right before stands for it
        if reads[0].inputs[0].dtype.is_complex:
            return None
        if reads[0].inputs[0].dtype.is_floating_point:  # a float Scalar argument torch read: the floats alone
            return {i for i in positions if _floats(r.args[i], positions[i])}, own
        return set(positions), own
    return {i for i in positions if _from_read(r.args[i], positions[i], values)}, own


def _offsets(recs, i: int, direct: set) -> bool:
    """Argument i is, in every step, one explained int argument plus the same amount (narrow's end)."""
    return any(all(isinstance(r.args[i], int) and isinstance(r.args[p], int) for r in recs)
               and len({r.args[i] - r.args[p] for r in recs}) == 1 for p in direct)


def _floats(arg, elements) -> bool:
    """`arg` is a float, or a keyword argument `(name, value)` / list whose changing elements are floats."""
    if isinstance(arg, float):
        return True
    return bool(elements) and isinstance(arg, (list, tuple)) and all(isinstance(arg[k], float) for k in elements)


def _from_read(arg, elements, values) -> bool:
    """`arg` (its changing `elements` where it is a size list or a keyword argument `(name, value)`) is a read
    value, or a size one more than it."""
    if isinstance(arg, (int, float)):
        return arg in values
    return bool(elements) and isinstance(arg, (list, tuple)) and all(
        isinstance(arg[k], (int, float)) and (arg[k] in values or (isinstance(arg[k], int) and arg[k] - 1 in values))
        for k in elements)


def read_back_on_line(ctx, recs) -> bool:
    """Every changing argument of the aligned calls is, in each step, a value the same line read back from a
    0-dim device tensor just before the call."""
    if recs[0].args and recs[0].args[0] == "value":
        return False  # a tensor built from host data
    positions = _changing(recs)
    if not positions:
        return False
    found = [_explained(ctx, r, positions) for r in recs]
    if any(f is None for f in found):
        return False
    direct = set.intersection(*(f[0] for f in found))
    rest = set(positions) - direct
    return not rest or (bool(direct) and all(f[1] for f in found) and all(_offsets(recs, i, direct) for i in rest))
