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

The pick can also align as ops one step ran and the other did not: `nn.Linear` on a `[B, n, D]` slice of a padded
buffer flattens it with a `view` (then `addmm`) when the slice is the whole buffer, contiguous, and with a `clone`
(then `mm` + `add`) when it is not, and the weight's `t` both paths share splits the two, so difflib keeps the lone
`view` apart. An extra run of ops that launch nothing (views), issued by a statement the other step ran too, on
an input of a shape and layout that statement never read in the other step, is the same pick.

A torch call may also pick kernels by shape below any Python code: on a GPU, `F.scaled_dot_product_attention` with
a boolean mask whose key length is not a multiple of the memory-efficient kernel's alignment pads the mask
(`constant_pad_nd`, then a `slice` back) and runs the attention on the padded copy; other lengths go straight in. A
KV cache that grows by one token a step runs those two extra ops in some steps. Extra ops that launch kernels,
issued by one statement the other step ran too, whose first reads a shape that statement never read in the other
step, and on a line that chooses nothing itself (no `a if c else b`, no `and` / `or`), are such a pick.

An assignment through an index (`y[idx] += v`, `x[a:b] = v`) first strips the value's leading size-1 dims with a
`view` when it has any: the rows an expert got from a `nonzero` are one in some steps and two in others, so one
step runs `view` + `index_put_` and the next `index_put_` alone. That `view` launches nothing and follows the
row count, so it is left out of the sequences the steps are compared on.
"""

from __future__ import annotations

__all__ = ["picked_by_layout", "without_prefix_views"]

import ast

from audit.detectors.branches.elided_slices import slices_vs_alias
from audit.detectors.source.lookup import tree
from audit.scan.sources.ast_nodes import all_nodes

_NO_KERNEL = frozenset({"aten.view", "aten._unsafe_view", "aten.alias", "aten.reshape", "aten.expand", "aten.t",
                        "aten.transpose", "aten.permute", "aten.unsqueeze", "aten.squeeze", "aten.slice",
                        "aten.select", "aten.as_strided"})

_SETITEM_WRITES = frozenset({"aten.index_put_", "aten.index_put", "aten.copy_"})


def picked_by_layout(tag, ra, rb, i1, i2, j1, j2) -> bool:
    """A replaced region whose ops, on both sides, were all issued by one statement (the same frames; the
    statement goes on after it in both steps, or ends with it in both: `k = self.k_proj(enc)` on a line of its
    own), and whose first ops read inputs of other
    shapes, or of the same shapes in other layouts, in the two steps."""
    if tag in ("insert", "delete"):
        return _viewed_by_layout(ra[i1:i2], rb, j1) if tag == "delete" else _viewed_by_layout(rb[j1:j2], ra, i1)
    if tag != "replace":
        return False
    return _one_statement(ra, rb, i1, i2, j1, j2) or _into_next_views(ra, rb, i1, i2, j1, j2) or \
        _into_next_views(rb, ra, j1, j2, i1, i2)


def _into_next_views(x, y, a1, a2, b1, b2) -> bool:
    """The region runs on, in step x only, into the leading views of the next statement (`k = self.k_proj(enc)`
    then `v = self.v_proj(enc)`: one step's `addmm`, `view` and v_proj's flattening `view` against the other's
    `clone` ... `add`): those views are a pick of their own statement, and the rest one of the first's (or a
    slice against the alias of a subscript torch skipped)."""
    k = a2
    while k > a1 and x[k - 1].op in _NO_KERNEL and x[k - 1].stack != x[a1].stack:
        k -= 1
    if k in (a1, a2) or not _viewed_by_layout(x[k:a2], y, b2):
        return False
    return _one_statement(x, y, a1, k, b1, b2) or slices_vs_alias(x[a1:k], y[b1:b2])


def _one_statement(ra, rb, i1, i2, j1, j2) -> bool:
    ea, eb = ra[i1:i2], rb[j1:j2]
    if not ea or not eb:
        return False
    stack = ea[0].stack
    if not stack or any(r.stack != stack for r in (*ea, *eb)):
        return False
    goes_on = [k < len(r) and r[k].stack == stack for r, k in ((ra, i2), (rb, j2))]
    if goes_on[0] != goes_on[1]:  # the statement ends with the region in one step only
        return False
    return [(tuple(m.shape), tuple(m.stride)) for m in ea[0].inputs] != \
        [(tuple(m.shape), tuple(m.stride)) for m in eb[0].inputs]


def _sig(m) -> tuple:
    return tuple(m.shape), tuple(m.stride)


def _viewed_by_layout(extra, other, at) -> bool:
    """`extra` (one step's ops the other step lacks at `other[at]`) are views of one statement whose ops the other
    step ran right there, and the first reads a tensor of a shape or layout none of those ops read; or ops that
    launch kernels, when the first reads a shape none of those ops read and the statement holds no choice of its
    own (a conditional expression, `and` / `or`): torch picked them inside the call (kernel_pick)."""
    if not extra:
        return False
    stack = extra[0].stack
    if not stack or any(r.stack != stack for r in extra):
        return False
    lo, hi = at, at
    while lo > 0 and other[lo - 1].stack == stack:
        lo -= 1
    while hi < len(other) and other[hi].stack == stack:
        hi += 1
    if lo == hi:
        return False
    if any(r.op not in _NO_KERNEL for r in extra):
        shapes = {tuple(m.shape) for r in other[lo:hi] for m in r.inputs}
        return any(tuple(m.shape) not in shapes for m in extra[0].inputs[:1]) and not _chooses(stack[-1])
    seen = {_sig(m) for r in other[lo:hi] for m in r.inputs}
    return any(_sig(m) not in seen for m in extra[0].inputs[:1])


def _chooses(frame) -> bool:
    """The statement on the frame's line picks between expressions itself (`a if c else b`, `x or y`), or its
    source cannot be read: the step's code may have chosen, not torch."""
    code, line = frame
    t = tree(code.co_filename)
    if t is None:
        return True
    return any(isinstance(n, (ast.IfExp, ast.BoolOp)) and n.lineno <= line <= (n.end_lineno or n.lineno)
               for n in all_nodes(t))


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
