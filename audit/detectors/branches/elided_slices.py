"""Slices torch skips when they cover the whole dimension: a varying bound, not a branch.

torch's indexing dispatches nothing for a full-range slice (`x[:n]` with n == x.size(0) is x itself), and a
subscript whose every slice was skipped returns `aten.alias` of the tensor. So a statement slicing by a bound
that varies runs `aten.slice` in some steps and nothing, or an alias, in others: `self.out[: len(drafts)] = ...`,
a streaming resampler's `chunk = self.buf[..., : self.n]` whose staged length sometimes fills the buffer.
Likewise `out[idx] = v` flattens a value of one leading row (`aten.view`) only when the index picks one row.
No branch chose anything there: the varying bound or length is baked-host-value / dynamic-shape, reported at
that statement.
"""

from __future__ import annotations

__all__ = ["elided_slice", "slices_vs_alias"]

_SHAPE_ELIDED = ("aten.slice", "aten.view", "aten.squeeze", "aten.unsqueeze", "aten.alias")


def elided_slice(tag, ra, rb, i1, i2, j1, j2) -> bool:
    """A differing region made only of such skipped ops of one statement (the same frames): extra slices or
    views whose statement goes on in both steps (for a view: on inputs of other shapes), extra slices after
    an op of that statement both steps ran (`buf[0, :n]`: the `select` is shared, the slice is not), or slices
    in one step against the alias the other step's fully skipped subscript returned."""
    if tag == "replace":
        return slices_vs_alias(ra[i1:i2], rb[j1:j2])
    if tag not in ("insert", "delete"):
        return False
    extra, rest, other = (ra[i1:i2], ra[i2:], rb[j1:]) if tag == "delete" else (rb[j1:j2], rb[j2:], ra[i1:])
    if not extra or any(r.op not in _SHAPE_ELIDED for r in extra) or \
            any(r.stack != extra[0].stack for r in extra):
        return False
    if all(r.op == "aten.slice" for r in extra):
        before = (ra[i1 - 1] if i1 else None, rb[j1 - 1] if j1 else None)
        return bool(rest) and rest[0].stack == extra[0].stack or \
            all(b is not None and b.stack == extra[0].stack for b in before)
    return bool(rest) and bool(other) and all(r.stack == rest[0].stack for r in extra) and \
        other[0].op == rest[0].op and other[0].stack == rest[0].stack and \
        [m.shape for m in other[0].inputs] != [m.shape for m in rest[0].inputs]


def slices_vs_alias(ea, eb) -> bool:
    """One side only slices, the other is the one alias a subscript returns when it skipped them all; both
    made by one statement from the same tensor (its shape and layout)."""
    if not ea or not eb:
        return False
    sl, al = (ea, eb) if eb[0].op == "aten.alias" else (eb, ea)
    if len(al) != 1 or al[0].op != "aten.alias" or any(r.op != "aten.slice" for r in sl):
        return False
    if any(r.stack != al[0].stack or not r.stack for r in sl):
        return False
    src = lambda r: [(tuple(m.shape), tuple(m.stride)) for m in r.inputs[:1]]  # noqa: E731
    return src(sl[0]) == src(al[0])
