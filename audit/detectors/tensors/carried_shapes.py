"""A varying input that an earlier audited step made at another origin of a shape: downstream, not an origin.

dynamic-shape is reported where a variation starts, and an input from outside the step whose shape varies is
such a start: `prepare()` rebinding the input to a longer tensor. A cache that the step itself grows at its end
(`self.cache = tree_map(lambda old, new: torch.cat([old, new], 1), self.cache, new)`) is read at the start of
the next step by the attention that consumes it; that read takes a tensor from outside the step too, yet its
shape only follows the `cat` of the step before, which is the origin (reported there, with the escape). So an
input counts as carried when every audited step after the first read it from storage that an earlier audited
step created at a shape-varying call whose shape did not come from this call: following that maker's inputs
back through the shape-varying calls of its own step never reaches this call. The `cat` growing the cache, read
back by itself (directly, or through `torch.cat(...) * 1.0` stored back), is on that loop and stays the origin;
the attention reading the cache is off it. The first audited step's predecessor ran untraced: its provenance is
unknown and does not count against the rule.

The `cat` may also read its own last output through ops that keep its shape: a beam search reorders the running
ids by beam before appending (`self.seqs = torch.cat([self.seqs[beam_idx], tok], -1)`). The reorder is then the
call that reads from outside, and it only passes the growth on; the `cat`, whose inputs are all the step's own,
is where the shape changes, and stays the origin (`grows_own_output`).
"""

from __future__ import annotations

from bisect import bisect_left


def makers(plan) -> dict:
    """(step, index) -> group, for every record of the shape-varying calls in `plan` ([(records, ...)])."""
    return {(r.step, r.index): gid for gid, item in enumerate(plan) for r in item[0]}


def _producers(ctx, step: int, memo: dict) -> dict:
    """tensor id -> indices (ascending) of the ops of `step` that output a tensor at that address."""
    if step not in memo:
        out: dict = {}
        for r in ctx.steps[step]:
            for m in r.outputs:
                out.setdefault(m.tid, []).append(r.index)
        memo[step] = out
    return memo[step]


def _made_before(by_tid: dict, tid: int, index: int) -> int:
    """The op that made the tensor read at `index`: the last one before it to output that address. An address is
    a TensorImpl's, reused once the tensor is freed: a cache grown in a loop (`self.keys = torch.cat([self.keys,
    k])`, then the same for the values) frees the old keys, and the values' `cat` right after may get their
    address; that later op made nothing the earlier read saw."""
    idx = by_tid.get(tid, ())
    k = bisect_left(idx, index)
    return idx[k - 1] if k else -1


def _shape_sources(ctx, made, made_by: dict, memo: dict) -> set:
    """The groups of the shape-varying calls that `made` ((step, index)) follows within its step, itself included."""
    step, seen, todo, groups = made[0], {made}, [made], set()
    by_tid = _producers(ctx, step, memo)
    while todo:
        key = todo.pop()
        groups.add(made_by[key])
        rec = ctx.steps[step][key[1]]
        for m, inside in zip(rec.inputs, rec.in_step):
            src = (step, _made_before(by_tid, m.tid, key[1]))
            if inside and src in made_by and src not in seen:
                seen.add(src)
                todo.append(src)
    return groups


def carried_from_earlier_step(ctx, recs, varying, made_by: dict, gid: int, memo: dict) -> bool:
    """Whether each varying input of `recs` (one aligned call per step, group `gid`) that came from outside its
    step was made in an earlier audited step by a shape-varying call whose shape does not follow this call, in
    every step but the first."""
    born, first, checked = ctx.trace.born, min(r.step for r in recs), False
    prev: dict = {}
    for r in recs:
        for j in varying:
            if j >= len(r.in_step) or r.in_step[j]:
                continue
            made, shape = born.get(r.inputs[j].sid), tuple(r.inputs[j].shape)
            kept, prev[j] = prev.get(j) == shape, shape
            if made is None and (r.step == first or kept):
                continue  # (made before the audited steps, and of the shape the step before read: nothing varied)
            if made is None or made not in made_by or made[0] >= r.step or \
                    (gid in _shape_sources(ctx, made, made_by, memo) and not _passes_on(r, j)):
                return False
            checked = True
    return checked


def _passes_on(r, j: int) -> bool:
    """The call gives out its varying input's shape unchanged (a dequantize `q.to(dtype) * scale + mn`): in a cycle
    through the steps (a quantized cache dequantized, grown by a `cat`, quantized back) it carries the growth the
    `cat` makes, and the `cat`, which changes the shape, stays the origin."""
    return bool(r.outputs) and all(tuple(o.shape) == tuple(r.inputs[j].shape) for o in r.outputs)


def grows_own_output(ctx, recs, varying, made_by: dict, gid: int, memo: dict) -> bool:
    """Whether each call of `recs` (group `gid`) changes the shape of a varying input it got from within its step,
    and that input follows, through shape-varying calls that pass their input's shape on, a read from outside the
    step of what this same call made in an earlier audited step: the call grows its own output, read back through
    a reorder. Checked in every step but the first (whose predecessor ran untraced)."""
    born, first, checked = ctx.trace.born, min(r.step for r in recs), False
    for r in recs:
        if r.step == first:
            continue
        grown = [j for j in varying if j < len(r.in_step) and r.in_step[j] and not _passes_on(r, j)]
        if not grown or not any(_reads_back(ctx, r, j, made_by, gid, born, memo) for j in grown):
            return False
        checked = True
    return checked


def _reads_back(ctx, r, j: int, made_by: dict, gid: int, born: dict, memo: dict, depth: int = 8) -> bool:
    """Whether input `j` of `r` was made in its step by a chain of shape-passing calls (at most `depth`) that starts
    at a read of storage an earlier step's call of group `gid` made."""
    by_tid = _producers(ctx, r.step, memo)
    key = (r.step, _made_before(by_tid, r.inputs[j].tid, r.index))
    for _ in range(depth):
        if key not in made_by:
            return False
        rec = ctx.steps[r.step][key[1]]
        outside = [k for k, inside in enumerate(rec.in_step) if not inside and _passes_on(rec, k)]
        if any((m := born.get(rec.inputs[k].sid)) is not None and m[0] < r.step and made_by.get(m) == gid
               for k in outside):
            return True
        inner = [k for k, inside in enumerate(rec.in_step) if inside and _passes_on(rec, k)]
        if not inner:
            return False
        key = (r.step, _made_before(by_tid, rec.inputs[inner[0]].tid, rec.index))
    return False
