"""data-dependent-control: a `for` loop over a tensor whose length a data-dependent op chose in the step.

`for idx in mask.nonzero():` (transformers' MoE experts loop over `expert_hit`) runs as many trips as the data
has hits. The op-sequence comparison (control.py) sees that only when two audited steps happened to run another
number of trips; with few tokens and many experts the count can hold for every audited step, and then nothing
differs though the trip count is still the data's. A graph replays the count it captured. So the loop itself is
the finding: `Tensor.__iter__` unbinds the tensor, and the tensor (or the view it is read through) was made by an
op whose output size is data-dependent (nonzero, unique, masked_select) earlier in the same step. Loops whose
trip count moved are control.py's finding and are left to it.
"""

from __future__ import annotations

from collections import defaultdict

from audit.detectors import register

# ops whose output size is read from the device data (host_sync.py reports each as a read; size_tests.py keeps
# a branch after one a data branch)
SIZED_BY_DATA = frozenset({"aten.nonzero", "aten._unique2", "aten.unique_dim", "aten.unique_consecutive",
                            "aten._unique", "aten.masked_select"})


def _origin(rec, made_by: dict):
    """The data-sized op behind `rec`'s first input, followed back through views of it; None when there is none."""
    seen = 0
    meta = rec.inputs[0] if rec.inputs else None
    while meta is not None and seen < 16:
        src = made_by.get(meta.tid)
        if src is None:
            return None
        if src.op in SIZED_BY_DATA:
            return src
        ins = [m for m in src.inputs if m.sid == meta.sid]  # a view of one of its inputs: same storage
        meta = ins[0] if ins else None
        seen += 1
    return None


def _rows(rec) -> bool:
    """An unbind along dim 0, as `Tensor.__iter__` runs it; `torch.where(mask)` unbinds nonzero's columns (dim 1)."""
    dims = [a for a in rec.args[1:] if isinstance(a, int) and not isinstance(a, bool)]
    dims += [a[1] for a in rec.args if isinstance(a, tuple) and len(a) == 2 and a[0] == "dim"]
    return not dims or dims[0] == 0


@register("data-dependent-control")
def loops_sized_by_data(ctx):
    """A loop over the rows of a tensor that nonzero/unique sized from the data, whose trip count the audited
    steps happened not to change: a graph keeps the captured count whatever the next token routes to."""
    trips: dict = defaultdict(dict)  # site key -> step -> trip counts seen there
    first: dict = {}
    for step, recs in enumerate(ctx.steps):
        made_by = {}
        for r in ctx.ops(step):
            if r.op == "aten.unbind" and _rows(r) and (src := _origin(r, made_by)) is not None:
                key = ctx.site_key(r)
                trips[key].setdefault(step, []).append(len(r.outputs))
                first.setdefault(key, (r, src))
            for m in r.outputs:
                made_by[m.tid] = r
    for key, per_step in trips.items():
        counts = {tuple(v) for v in per_step.values()}
        if len(per_step) < 2 or len(counts) != 1:
            continue  # ran once, or the count moved: the op sequences differ and control.py names the loop
        rec, src = first[key]
        n = next(iter(counts))
        sf, sl, _ = ctx.where(src)
        yield ctx.finding(
            "data-dependent-control", rec, "for (data-sized)", len(per_step) / ctx.n_steps,
            f"loops over the rows of a tensor whose length `{src.op}` at {sf}:{sl} reads from the data "
            f"({'/'.join(map(str, n))} trip(s) in each audited step, by chance): a graph replays the captured "
            "trip count whatever the data picks",
            fix="Loop over a fixed range (every expert, every slot) with masks, or batch the work so that no "
                "host-side count of the data decides how many times it runs.")
