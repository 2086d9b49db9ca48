"""A torch call that flattens its input and views the result back: downstream of the input's varying shape.

`F.linear` (and `matmul`) on a 3-D input runs `view(x, [b * n, k])`, `addmm`, then `view(out, [b, n, m])` below any
statement. When `x` came from an earlier call whose shape varies (einops' `rearrange(x, "(b n) d -> b n d",
b=num_graphs)` with a per-request count), the last view's sizes change while its own input, the flat product,
keeps its shape: it read as a second origin (a dynamic-shape and a baked-host-value at the `self.qkv(h)` line)
whose only fix is the first call's. The view is downstream when an earlier op of the same call (the same frames)
made its input and one read the earlier call's output, and every varying size equals, step by step, one
dimension of that output (the same one each step): the sizes were read off it inside torch.
"""

from __future__ import annotations

_VIEWS = ("aten.view", "aten._unsafe_view", "aten.reshape")


def restores_input_dims(ctx, mine: dict, theirs: dict, dims: list) -> bool:
    """`mine`/`theirs`: step -> the aligned record of this call / of the earlier varying call; `dims`: the
    (output, dim) sizes of `mine` that vary."""
    for s, r in mine.items():
        if r.op not in _VIEWS or not r.inputs or not _same_call_reads(ctx, r, {o.tid for o in theirs[s].outputs}):
            return False
    first = theirs[next(iter(mine))].outputs
    slots = [(k, d) for k, o in enumerate(first) for d in range(len(o.shape))]
    return all(any(all(len(theirs[s].outputs[k].shape) > d
                       and mine[s].outputs[j].shape[e] == theirs[s].outputs[k].shape[d] for s in mine)
                   for k, d in slots) for j, e in dims)


def _same_call_reads(ctx, r, tids: set) -> bool:
    """Earlier ops of `r`'s own call (the run of records with its frames just before it) made `r`'s input and
    read one of `tids`."""
    recs = ctx.steps[r.step] if r.step < len(ctx.steps) else []
    if r.index >= len(recs) or recs[r.index] is not r:
        return False
    made = read = False
    for q in reversed(recs[:r.index]):
        if q.kind != "aten":
            continue
        if q.stack != r.stack:
            break
        made |= any(o.tid == r.inputs[0].tid for o in q.outputs)
        read |= any(m.tid in tids for m in q.inputs)
    return made and read
