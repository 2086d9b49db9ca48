"""A bound of its own read off a host counter, in step with a varying input's size: another origin.

dynamic-shape reports where a shape variation starts and leaves the ops that only follow a varying input alone.
A call whose input already varies can still move its output with a value of its own: a sparse-attention indexer
scores the compressed cache it cuts to `end_pos // ratio` and then takes `index_score.topk(min(self.index_topk,
end_pos // ratio))`, `end_pos = start_pos + seqlen` with `start_pos` a Python position handed down the layers.
The top-k count moves with the score's width step by step, yet it is no size read: scoring the whole
preallocated cache (the fix of the slice's finding) leaves `k` growing with the position. So a call whose
non-tensor arguments change between the steps is an origin of its own beside its input's when the statement
names the op (`.topk(...)`, `torch.narrow(...)`) and that call's arguments, its receiver aside, read a host
counter outside their size reads: on the line, through a local bound from one, or through parameters a caller
passed it (`passed_counters`). Sizes torch derives inside a composite (the `view`s of a `matmul` over a grown
key slice) are no argument the statement passes, and a tensor operand bound from a counter slice is not read.
"""

from __future__ import annotations

import ast

from audit.detectors.source import lookup
from audit.detectors.tensors import passed_counters
from audit.detectors.tensors.read_sizes import _statement, counter_attrs
from audit.detectors.tensors.size_reads import _attrs_read, _bound, _tensor_made


def _named_calls(st, op: str) -> list:
    """The calls of statement `st` to a function or method named like the aten op (`aten.topk` -> `topk`)."""
    base = op.split(".")[1].rstrip("_") if op.count(".") else op
    out = []
    for n in ast.walk(st):
        if isinstance(n, ast.Call):
            name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            if name.rstrip("_") == base:
                out.append(n)
    return out


def _plain_args(call: ast.Call, func, line: int) -> list:
    """The call's arguments, its receiver aside, less those that are tensor operands: a subscript, or a name the
    function bound from a subscript or a tensor-making call (`keys = self.cache[:, :pos]`)."""
    out = []
    for a in list(call.args) + [k.value for k in call.keywords]:
        if isinstance(a, (ast.Subscript, ast.Starred)):
            continue
        if isinstance(a, ast.Name) and any(isinstance(v, ast.Subscript) or _tensor_made(v)
                                           for v in _bound(func, {a.id}, line)):
            continue
        out.append(a)
    return out


def own_counter_bound(ctx, recs) -> bool:
    """The aligned calls `recs` (one per step) got other non-tensor arguments and the statement's call of the op
    passes an argument read off a host counter: the output follows that counter, not only the varying input."""
    r0 = recs[0]
    if len({r.args for r in recs}) < 2 or not r0.stack:
        return False
    counters = counter_attrs(ctx)
    if not counters:
        return False
    frames = [(code.co_filename, line) for code, line in reversed(r0.stack)]
    filename, line = frames[0]
    st = _statement(filename, line)
    func = lookup.enclosing_function(filename, line)
    parts = [a for c in (_named_calls(st, r0.op) if st is not None else ()) for a in _plain_args(c, func, st.lineno)]
    if not parts:
        return False
    names = set().union(*map(passed_counters.value_names, parts))
    bound = [v for v in _bound(func, names, st.lineno) if not _tensor_made(v)]
    return any(_attrs_read(v) & counters for v in parts + bound) or \
        passed_counters.passed_counter([(filename, st.lineno)] + frames[1:], parts, counters)
