"""host-sync a CPU scan cannot see: a COO sparse tensor built without its size.

`torch.sparse_coo_tensor(indices, values)` with no size infers it from the data: ATen takes the
indices' max along each dim, adds one, and copies that to the host (`.to(kCPU)`) to size the
tensor. On the GPU that copy waits for the device; on a CPU tensor it is no op, so a CPU scan sees
only the `min.dim`, `max.dim` and `add_` that come right before the constructor, on the same
indices. Those four, in that order from one line, are the sign. CUDA scans trace the copy itself.
"""

from __future__ import annotations

from audit.detectors import register

_CTOR = "aten._sparse_coo_tensor_with_dims_and_tensors"


def _sized_from_data(recs: list, i: int) -> bool:
    """Whether the constructor at recs[i] follows max.dim and add_ on its own indices (the size inference)."""
    r = recs[i]
    if i < 2 or len(r.inputs) < 1:
        return False
    mx, add = recs[i - 2], recs[i - 1]
    indices = r.inputs[0]
    return (mx.op == "aten.max" and add.op == "aten.add_" and mx.frame == r.frame == add.frame
            and bool(mx.inputs) and mx.inputs[0].sid == indices.sid)


@register("host-sync")
def sparse_size_from_indices(ctx):
    """On a CPU scan: `sparse_coo_tensor` without size= reads the indices' max from the device."""
    if ctx.cuda:
        return []
    hits = [r for recs in ctx.steps for i, r in enumerate(recs)
            if r.kind == "aten" and r.op == _CTOR and not r.nested and _sized_from_data(recs, i)]
    return [ctx.finding("host-sync", group[0], "torch.sparse_coo_tensor", len(group) / ctx.n_steps,
                        "`sparse_coo_tensor` without a size infers it from the indices: their max is copied to "
                        "the host, which waits for the device",
                        fix="Pass size= (the static dense shape), so nothing is read back.")
            for (_, _, _), group in ctx.per_site(hits).items()]
