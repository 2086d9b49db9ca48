"""baked-host-value: a statement that ran in one audited step only and takes a host counter as a plain number.

Multi-rate code runs a block every r-th step (a KV compressor under `if (start_pos + 1) % ratio == 0:`, a cache
refreshed every N tokens). Inside it, `self.freqs_cis[start_pos + 1 - ratio]` or `self.kv_cache[:bsz, start_pos //
ratio] = kv` hands the position to the op as a host index. The op ran in one of the audited steps, so there is no
second value for the diff of aligned calls (baked.varying_host_values) to see change. The statement still indexes
with an expression that reads a host counter that did change between the steps (read_sizes.counter_attrs, on the
line, through a local bound from it, or through the parameters it was handed down as: passed_counters), and its op
took a plain number: capture freezes the value all the same. One finding per statement, beside the branch that runs
the block. A counter the statement only hands to a function of its own (`self.pool(kv, pos // m)`) is that
function's to report, where it meets an op.
"""

from __future__ import annotations

import ast
import numbers
from collections import defaultdict

from audit.detectors import register
from audit.detectors.source.lookup import enclosing_function
from audit.detectors.tensors import passed_counters, read_sizes
from audit.detectors.tensors.size_reads import _attrs_read, _bound, _tensor_made


def _plain_number(args) -> bool:
    """A non-tensor int argument, also inside a list of them (`aten.slice`'s end, `aten.select`'s index)."""
    for a in args:
        if isinstance(a, (list, tuple)):
            if _plain_number(a):
                return True
        elif isinstance(a, numbers.Integral) and not isinstance(a, bool):
            return True
    return False


def _indexes_with_counter(frames, counters: set) -> bool:
    """The innermost statement indexes a tensor with an expression that reads a host counter (frames: (file, line),
    innermost first)."""
    filename, line = frames[0]
    st = read_sizes._statement(filename, line)
    parts = [n.slice for n in ast.walk(st) if isinstance(n, ast.Subscript)] if st is not None else []
    if not parts:
        return False
    names = {n.id for p in parts for n in ast.walk(p) if isinstance(n, ast.Name)}
    bound = [v for v in _bound(enclosing_function(filename, line), names, st.lineno) if not _tensor_made(v)]
    return any(_attrs_read(v) & counters for v in parts + bound) or \
        passed_counters.passed_counter([(filename, st.lineno)] + frames[1:], parts, counters)


@register("baked-host-value")
def once_run_counter_reads(ctx):
    """A statement's op that ran in one complete step only, took a plain number, and indexes with a changing host
    counter."""
    counters = read_sizes.counter_attrs(ctx)
    if not counters or len(ctx.complete) < 2:
        return []
    steps, first = defaultdict(set), {}
    for s in ctx.complete:
        for r in ctx.ops(s):
            if r.stack:
                key = ctx.site_key(r)
                steps[key].add(s)
                first.setdefault(key, r)
    out, seen = [], set()
    for key, ran in steps.items():
        r = first[key]
        where = (key[0], key[2])  # the statement and the target's line that led there
        if len(ran) != 1 or where in seen or not _plain_number(r.args):
            continue
        frames = [(code.co_filename, line) for code, line in reversed(r.stack)]
        if not _indexes_with_counter(frames, counters):
            continue
        seen.add(where)
        msg = (f"`{r.op}` takes a plain number from a host counter that changes every step, on a line that ran in "
               f"one audited step only (a block run every few steps): a graph keeps the value of the step it "
               f"captured")
        out.append(ctx.finding("baked-host-value", r, r.op, 1 / ctx.n_steps, msg,
                               fix="Index with a device tensor that prepare() advances in place (a position held "
                                   "on the device), not with the Python counter."))
    return out
