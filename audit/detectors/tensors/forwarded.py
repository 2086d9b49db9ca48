"""Ops a tensor subclass's traced `__torch_dispatch__` forwards unchanged to its inner tensors.

The scan runs a library subclass's Python dispatch under the tracer, so an op on the wrapper is two records:
the call on the wrapper (PyG's `EdgeIndex` in `edge_index[:, mask]`, at the library line that wrote it) and,
inside its body, the same op on the inner data (`aten.index.Tensor(input._data, indices)` in the subclass's
`_index`). They are one host read and one varying shape. The wrapper's call is the line to fix, so the
forwarded copy inside the body is left out by the rules that would report the op twice (host-sync,
dynamic-shape); what else the body runs (a `torch.nonzero` of its own) is still reported at its line.
"""

from __future__ import annotations


def forwarded(ctx) -> set:
    """(step, index) of the records that a traced subclass dispatch ran as the same op as its own call
    (computed once per scan: two rules ask)."""
    if (cached := ctx.__dict__.get("_forwarded")) is not None:
        return cached
    out = ctx.__dict__["_forwarded"] = set()
    for step, recs in enumerate(ctx.steps):
        for r in recs:
            if not r.note.startswith("body:"):
                continue
            start = int(r.note[5:])
            out.update((step, j) for j in range(start, r.index) if recs[j].op == r.op)
    return out
