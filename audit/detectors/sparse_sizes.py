"""host-syncs of sparse and segmented layouts that a CPU scan cannot see in the ops alone.

A COO sparse tensor built without its size:

`torch.sparse_coo_tensor(indices, values)` with no size infers it from the data: ATen takes the
indices' max along each dim, adds one, and copies that to the host (`.to(kCPU)`) to size the
tensor. On the GPU that copy waits for the device; on a CPU tensor it is no op, so a CPU scan sees
only the `min.dim`, `max.dim` and `add_` that come right before the constructor, on the same
indices. Those four, in that order from one line, are the sign. CUDA scans trace the copy itself.

A compressed sparse tensor (CSR, CSC, BSR, BSC) built without its size: ATen's
`_estimate_sparse_compressed_tensor_size` reads `plain_indices.max().item()` inside the one constructor op
(`sparse_compressed_tensor.comp_plain_value`, `sparse_csr_tensor.crow_col_value`, ...), on any device.

A COO tensor coalesced in the step (`.coalesce()`, the `_coalesce` op, which runs only when the tensor is not
coalesced yet): merging duplicate indices gives a data-dependent nnz, read back to size the result (a
`unique` in disguise). The sparse matmuls of CUDA (`torch.sparse.mm`, `A @ x`, `addmm`, `bmm`, `hspmm` with a
COO operand) coalesce an uncoalesced operand first (ATen's `s_addmm_out_sparse_dense_cuda` calls
`sparse_.coalesce()`), which the CPU kernels do not: the tracer records whether each COO operand is coalesced
(`audit/scan/layouts.py`), and an uncoalesced one is the read on a GPU.

`torch.segment_reduce(data, r, lengths=...)` without `unsafe=True` checks the lengths inside its kernel
(`lengths.min().item()`, and that they sum to the data's size, `.item()` again): reads below the dispatcher that
no op shows, on any device. The `offsets=` form checks nothing on the host.
"""

from __future__ import annotations

import torch

from audit.detectors import register
from audit.detectors.host_sync import sync_op
from audit.scan.layouts import COO

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
            for (_, _, _, _), group in ctx.per_site(hits).items()]


_COALESCE_FIX = ("Coalesce outside the step (in make() or prepare()), or build the tensor with "
                 "`is_coalesced=True` when its indices are unique and sorted, or keep a fixed pattern (a CSR "
                 "tensor whose values are refreshed in place) or a dense `index_add_` / `scatter_add_`.")


@sync_op("aten._coalesce")
def coalesce_in_step(rec):
    """Coalescing merges duplicate indices: the new nnz is counted on the device and read back."""
    return ("`coalesce()` of an uncoalesced COO tensor merges duplicate indices: the resulting nnz is read "
            "from the device to size the indices and values", _COALESCE_FIX)


@sync_op("aten.mm", "aten.addmm", "aten._sparse_addmm", "aten._sparse_mm", "aten.bmm", "aten.hspmm")
def uncoalesced_matmul(rec):
    """On a GPU a sparse matmul coalesces an uncoalesced COO operand first (the nnz read back)."""
    if not any(m.sparse == COO for m in rec.inputs):
        return None
    return (f"`{rec.op}` with an uncoalesced COO operand: on a GPU the kernel coalesces it first, reading the "
            "merged nnz back from the device (the CPU kernel does not)", _COALESCE_FIX)


@sync_op("aten.segment_reduce")
def segment_lengths_check(rec):
    """lengths= without unsafe=True: the kernel reads lengths.min() and their sum back to check them."""
    kw = dict(a for a in rec.args if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str))
    if kw.get("lengths") is None or kw.get("unsafe") is True:
        return None
    return ("`segment_reduce` with `lengths=` checks them inside the kernel (`lengths.min().item()` and their sum "
            "against the data's size): two host reads no op shows",
            "Pass `unsafe=True` (lengths known valid), or `offsets=` (cumsum of the lengths with a leading 0), "
            "which the kernel does not check on the host.")


_COMPRESSED = ("aten.sparse_compressed_tensor", "aten.sparse_csr_tensor", "aten.sparse_csc_tensor",
               "aten.sparse_bsr_tensor", "aten.sparse_bsc_tensor")


@sync_op(*_COMPRESSED)
def compressed_size_from_indices(rec):
    """No size given (an overload without `_size`): the plain indices' max is read back to size the tensor."""
    if getattr(rec.func, "_overloadname", "").endswith("_size") or len(rec.inputs) < 2:
        return None
    if not torch.Size(rec.inputs[1].shape).numel():
        return None
    return (f"`{rec.op}` without a size infers it from the indices: `plain_indices.max().item()` inside the "
            "constructor waits for the device",
            "Pass size= (the static dense shape), so nothing is read back.")
