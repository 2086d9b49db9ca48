"""host-sync: the host waits for the device (a value, a size, or an explicit synchronize).

Under torch.cuda.graph any of these invalidates the capture without naming the op, and the
process is poisoned afterwards (docs/hazards.md). Three sources, one finding per source line:
- aten ops whose result size or value needs device data (SYNC_OPS below, keyed by op);
- host reads hooked at the Tensor-method level (`.item()`, `.tolist()`, `bool(t)`, `.cpu()`, ...),
  which on a CPU tensor never reach the dispatcher yet sync on a GPU;
- explicit waits (torch.cuda.synchronize, Event/Stream.synchronize/query), sync-debug-mode
  warnings (at the line Python saw them) and _gpu_trace sync callbacks (CUDA scans).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from audit.detectors import register
from audit.detectors.device import capture_guards
from audit.detectors.host import inside_torch
from audit.detectors.source import lookup
from audit.detectors.sized_loops import SIZED_BY_DATA
from audit.detectors.tensors.forwarded import forwarded
from audit.scan.patches.hooks import NON_BLOCKING
from audit.detectors.host.own_copies import reads_of_copies
from audit.detectors.device.guarded_copies import reads_after_guarded_copies
from audit.detectors.host.kept import (computes_on_host, from_device, host_born, host_derived, host_factories,
                                   host_tensors, in_place_updates, kept_on_host, pinned_host)

SYNC_OPS: dict[str, Callable] = {}  # "aten.nonzero" -> rule(record) -> (message, fix) | None


def sync_op(*ops: str):
    """Registers a per-op rule; it returns (message, fix) when this call synchronizes."""

    def deco(fn):
        for op in ops:
            SYNC_OPS[op] = fn
        return fn

    return deco


_BOOLS = (torch.bool, torch.uint8)
_DEVICE_FIX = ("Keep it on the device: select with torch.where/masks, or read the value outside "
               "the step (after replay) when the host really needs it.")


@sync_op("aten._local_scalar_dense", "aten.item", "aten.equal", "aten.allclose", "aten.is_nonzero")
def scalar_read(rec):
    """A device value becomes a Python scalar: the host waits for every queued kernel."""
    return (f"`{rec.op}` reads a device value into a Python scalar", _DEVICE_FIX)


@sync_op(*sorted(SIZED_BY_DATA), "aten.bincount", "aten.histc")
def data_dependent_size(rec):
    """The output size depends on device data, so the host must read it before allocating.
    (histc only when it has to find min/max itself: min == max, the default.)"""
    if rec.op == "aten.histc":
        lo, hi = (list(rec.args[2:4]) + [0, 0])[:2]
        if lo != hi:
            return None
    fixes = {
        "aten.nonzero": "torch.where(mask, a, b) on the full tensor, or torch.nonzero_static(x, size=MAX).",
        "aten.bincount": "scatter_add_ ones into a preallocated [n_bins] counter (fixed size, no sync).",
        "aten.masked_select": "torch.where(mask, x, 0) on the full tensor, reduce with the mask.",
    }
    fix = fixes.get(rec.op, "Use a fixed-size formulation (static maximum plus a validity mask).")
    return (f"`{rec.op}` has a data-dependent output size: the host reads it from the device", fix)


@sync_op("aten._linalg_check_errors")
def linalg_error_check(rec):
    """torch.linalg.solve/inv/cholesky/... check their `info` result on the host: on a GPU the call
    waits for the device (torch's docs: "this function synchronizes that device with the CPU")."""
    return ("`torch.linalg` checks its `info` result on the host (the non-`_ex` form waits for the device)",
            "Call the `_ex` form (`torch.linalg.solve_ex`, `inv_ex`, `cholesky_ex`), which skips the "
            "check, and inspect `info` outside the step if needed.")


_TO_SPARSE = ("aten._to_sparse", "aten._to_sparse_csr", "aten._to_sparse_csc", "aten._to_sparse_bsr",
              "aten._to_sparse_bsc")


@sync_op(*_TO_SPARSE)
def dense_to_sparse(rec):
    """A dense tensor made sparse: the number of stored elements is counted on the device and read
    back to size the indices (nonzero in disguise). A sparse input (no dense storage) knows its nnz."""
    if not rec.inputs or not rec.inputs[0].sid:
        return None
    return (f"`{rec.op}` of a dense tensor sizes its indices by the nonzero count, read from the device",
            "Select with a fixed-size topk (indices of static size) or keep the dense mask and use "
            "torch.where / masks.")


@sync_op("aten.index", "aten.index_put_", "aten.index_put", "aten._index_put_impl_")
def bool_mask_index(rec):
    """Boolean-mask indexing is nonzero() in disguise: the result size is the number of Trues."""
    idx = index_tensors(rec)
    if any(m.dtype in _BOOLS for m in idx):
        return ("boolean-mask indexing (x[mask]) needs the number of True elements on the host",
                ("Use torch.where(mask, x, fill) / masked_fill on the full tensor, or gather with "
                 "indices from a fixed-size topk."))
    return None


@sync_op("aten.repeat_interleave")
def repeat_interleave_size(rec):
    """Without output_size= the total length is summed on the device and read back
    (only when the repeats are a tensor; repeat_interleave(x, 3) knows its size)."""
    overload = getattr(rec.func, "_overloadname", "Tensor")
    if overload not in ("Tensor", "self_Tensor") or any(isinstance(a, tuple) and len(a) == 2 and a[0] == "output_size" and a[1] is not None for a in rec.args):
        return None
    return ("`repeat_interleave` without output_size= reads the total length from the device",
            "Pass output_size= (a static maximum) so no read-back is needed.")


@sync_op("aten.one_hot")
def one_hot_classes(rec):
    """one_hot with num_classes=-1 reads max(x) from the device."""
    n = rec.args[1] if len(rec.args) > 1 else -1
    if n == -1:
        return ("`one_hot` without num_classes reads max(x) from the device", "Pass num_classes=.")
    return None


def copy_sides(rec):
    """(source meta, destination meta) of a copy op (`_to_copy`, `copy_`; `to` itself where the dispatch shows it
    undecomposed, as inside a tensor subclass's `__torch_dispatch__`), or None."""
    if rec.op in ("aten._to_copy", "aten.to") and rec.inputs and rec.outputs:
        return rec.inputs[0], rec.outputs[0]
    if rec.op == "aten.copy_" and len(rec.inputs) >= 2:
        return rec.inputs[1], rec.inputs[0]
    return None


def non_blocking(rec) -> bool:
    """copy_(src, True) or non_blocking=True among the normalized arguments."""
    if rec.op == "aten.copy_" and len(rec.args) > 2 and rec.args[2] is True:
        return True
    return any(isinstance(a, tuple) and len(a) == 2 and a[0] == "non_blocking" and a[1] is True for a in rec.args)


@sync_op("aten._to_copy", "aten.to", "aten.copy_")
def device_to_host(rec):
    """A copy from device memory into host memory waits for the device, unless it goes into
    pinned memory with non_blocking=True (then it is a captured memcpy node, see pageable-copy)."""
    sides = copy_sides(rec)
    if not sides or sides[0].device.type == "cpu" or sides[1].device.type != "cpu":
        return None
    if sides[1].pinned and non_blocking(rec):
        return None
    where = "pinned host memory (non_blocking=False)" if sides[1].pinned else "pageable host memory"
    return (f"device->host copy into {where} inside the step waits for the device "
            "(capture refuses it)", _DEVICE_FIX)


_HOST_FIX = {
    "Tensor.tolist": "Keep the values on the device (masks, gather, scatter_add_ into fixed-size buffers); "
                     "take sizes from host-side metadata instead of reading them back.",
    "Tensor.__bool__": "Replace the Python `if` on a tensor with torch.where / masks, or compute both branches.",
    "pickle": "Pickle after the step (or replay) from a static output buffer; inside the step, hand the "
              "other process device memory (torch.multiprocessing shares CUDA tensors without a copy).",
}


INDEX_PUT = ("aten.index_put_", "aten.index_put", "aten._index_put_impl_")


def index_tensors(r) -> tuple:
    """The index tensors of an aten.index / index_put record (an index_put's last input is the values)."""
    return r.inputs[1:-1] if r.op in INDEX_PUT else r.inputs[1:]


def masked_fill_dispatch(rec, lifted: set, cuda: bool) -> bool:
    """`x[mask] = 0.0`: index_put_ with one bool mask and a one-element host value. torch sends it to
    masked_fill_ (ATen's canDispatchToMaskedFill: one bool/uint8 index on x's device covering x's
    dims at its position, a CPU value of one element, no accumulate; Python's setitem makes a scalar
    value on the CPU for that), which needs no nonzero() and so no host read. On a CPU scan every
    value is a host tensor, so the value must have been built from host data on the assignment's own
    line (`lift_fresh` of the Python scalar), not computed on the device (`x[mask] = x.max()` syncs)."""
    if rec.op not in INDEX_PUT or len(rec.inputs) < 3 or len(rec.args) < 2 or not isinstance(rec.args[1], (tuple, list)):
        return False
    if len(rec.args) > 3 and rec.args[3] is True or any(isinstance(a, tuple) and a[:1] == ("accumulate",) and a[1] for a in rec.args[3:]):
        return False
    self_m, masks, value = rec.inputs[0], rec.inputs[1:-1], rec.inputs[-1]
    if len(masks) != 1 or masks[0].dtype not in _BOOLS or masks[0].device != self_m.device:
        return False
    lead = 0
    for a in rec.args[1]:
        if a is not None:
            break
        lead += 1
    mask = masks[0]
    if tuple(self_m.shape[lead:lead + len(mask.shape)]) != tuple(mask.shape):
        return False
    if value.device.type != "cpu" or 1 != (torch.Size(value.shape).numel()):
        return False
    return cuda or value.sid in lifted


def host_scalar_put(rec, lifted: set, cuda: bool) -> bool:
    """`x[idx] = 0.0` with an index torch cannot turn into masked_fill_ (integer indices, or a mask with
    accumulate): ATen's index_put_ first copies a one-element value that is not on x's device there
    (`value.to(x.device)`, from pageable memory: a copy that waits; pageable_copy.scalar_value_puts reports
    it), and Python's setitem makes a scalar value on the CPU for a GPU x. On a CUDA scan the value is a CPU
    tensor and x a GPU one; on a CPU scan the value must be lifted from host data on the assignment's own
    line (`x[idx] = x.max()` copies nothing)."""
    if rec.op not in INDEX_PUT or len(rec.inputs) < 2:
        return False
    value = rec.inputs[-1]
    if tuple(value.shape) != () or value.device.type != "cpu":
        return False
    return rec.inputs[0].device.type != "cpu" if cuda else value.sid in lifted


def host_values(recs) -> set:
    """Storage ids of tensors lifted from host data (a Python scalar, torch.tensor(...)) per line:
    {(sid, file, line)}."""
    return {(r.inputs[0].sid,) + tuple(r.frame[:2]) for r in recs if r.kind == "aten" and r.inputs and r.frame
            and r.op in ("aten.lift_fresh", "aten.lift_fresh_copy")}


def lifted_here(ctx, r) -> set:
    """(CPU scan) storage ids of the host values lifted at record r's line in its step; computed once per step
    for every detector that asks (on a CUDA scan: empty, the devices tell host from device)."""
    if ctx.cuda:
        return set()
    cache = ctx.__dict__.setdefault("_lifted", {})
    if r.step not in cache:
        cache[r.step] = host_values(ctx.steps[r.step])
    return {sid for sid, f, ln in cache[r.step] if (f, ln) == tuple(r.frame[:2])}


@register("host-sync")
def dispatched_syncs(ctx):
    """Aten ops that synchronize (SYNC_OPS), unless they are the inside of a hooked host read, or a
    bool-mask assignment of a host scalar that torch turns into masked_fill_ (masked_fill_dispatch)."""
    hits, inner = [], forwarded(ctx)  # a subclass's dispatch forwarding the op to its data: one read, the outer
    for r in ctx.all_records(("aten",)):
        rule = SYNC_OPS.get(r.op)
        if rule is None or r.nested or computes_on_host(ctx, r) or (r.step, r.index) in inner:
            continue
        if r.op in INDEX_PUT and r.frame and masked_fill_dispatch(r, lifted_here(ctx, r), ctx.cuda):
            continue
        res = rule(r)
        if res:
            hits.append((r, res))
    out, res_of = [], {id(r): res for r, res in hits}
    for (_, _, op, _), group in ctx.per_site(r for r, _ in hits).items():
        msg, fix = res_of[id(group[0])]
        out.append(ctx.finding("host-sync", group[0], op, len(group) / ctx.n_steps, msg, fix=fix))
    return out


def _runtime(r) -> bool:
    """A sync the CUDA runtime reported (not a call we patched)."""
    return r.note == "gpu_trace" or r.note.startswith("sync-debug")


def _covered(ctx) -> set:
    """(file, line) per step already explained by a hooked host read, a patched wait or a sync op."""
    out = set()
    for r in ctx.all_records(("aten", "host", "sync")):
        if _runtime(r) or not r.frame:
            continue
        rule = SYNC_OPS.get(r.op) if r.kind == "aten" else None
        if r.kind != "aten" or r.nested or (rule and rule(r)) or _host_to_device(r) or host_scalar_put(r, set(), True):
            out.add((r.step,) + r.frame[:2])
    return out


def to_host(ctx):
    """ids of the `.to(<cpu>)` candidates that would copy device->host on a GPU: the source names the CPU and
    the tensor is not a host tensor already (built from host data, or by a factory on the host).
    `non_blocking=True` is none: torch allocates that destination pinned (`_to_copy`'s pin_out) and the
    copy does not wait (under capture it is a memcpy node). Computed once per scan."""
    if (cached := getattr(ctx, "_to_host", None)) is not None:
        return cached
    keep = ctx._to_host = set()
    for recs in ctx.steps:
        born = None
        for r in recs:
            if r.kind == "host" and r.note == "cpu?" and r.stack and r.op != NON_BLOCKING:
                born = host_derived(recs, host_born(recs) | host_factories(recs)) if born is None else born
                if (not r.inputs or r.inputs[0].sid not in born) and lookup.names_cpu(
                        r.stack[-1][0].co_filename, r.stack[-1][1]):
                    keep.add(id(r))
    return keep


@register("host-sync")
def host_reads(ctx):
    """Tensor-method host reads (.item/.tolist/.cpu/.numpy/bool/int/float/index) and explicit waits.

    On a CPU scan these are the calls that would copy to the host and wait on a GPU. One read is
    one finding: on a GPU its copy lands in pageable memory, which the message says (the copy is
    not a second, pageable-copy finding)."""
    out = []
    for (file, line, op, _), group in ctx.per_site(read_records(ctx)).items():
        r = group[0]
        if r.kind == "host":
            shape = tuple(r.inputs[0].shape) if r.inputs else ()
            dest = "pageable host memory" if ctx.cuda else "the host"
            what = f"a {list(shape)} tensor" if r.inputs else "a tensor's storage"  # pickle saves the storage
            msg = f"`{op}` on {what} copies it to {dest} and waits for the device"
            msg, fix = inside_torch.explain(r, msg, _HOST_FIX.get(op, _DEVICE_FIX))
        elif op.endswith(".query"):
            msg = f"`{op}()` polls device progress from the host (not allowed while capturing)"
            fix = "Remove it from the step; poll outside the captured region."
        elif op.endswith(".elapsed_time"):
            msg = (f"`{op}()` reads two events' device timestamps on the host: it needs the device to have "
                   "reached both (a wait, or an error), and events recorded in a capture have none")
            fix = "Record the events in the step; read elapsed_time after the step (or after replay)."
        else:
            msg = f"`{op}()` blocks the host until the device is idle (capture cannot contain it)"
            fix = "Remove it from the step; gate profiling syncs behind a flag that is off during capture."
        guard = next(filter(None, (capture_guards.capture_guard(c.co_filename, n) for c, n in reversed(r.stack))), None)
        sev = None
        if guard:  # eager decode waits here, a capture never reaches it
            sev, msg = "info", f"{msg}; skipped while a graph is captured (`{guard}`): an eager-only stall"
        out.append(ctx.finding("host-sync", r, op, len(group) / ctx.n_steps, msg, fix=fix, severity=sev))
    return _one_per_line(out)


def read_records(ctx) -> list:
    """The host reads and waits host_reads reports (not of host memory, nor ones the runtime reported); cached."""
    if (cached := getattr(ctx, "_read_records", None)) is not None:
        return cached
    to_host_ids = to_host(ctx)
    copies = reads_of_copies(ctx)  # `ids = t.cpu()` then `int(ids[0])`: host memory, the copy was the wait
    copies |= reads_after_guarded_copies(ctx)  # `if x.is_cuda: x = x.cpu()` skipped here, then `x.numpy()`
    ctx._read_records = [r for r in ctx.all_records(("host", "sync")) if not _runtime(r)
                         and (r.note != "cpu?" or id(r) in to_host_ids)
                         and not (r.kind == "host" and (kept_on_host(ctx, r) or id(r) in copies))]
    return ctx._read_records


def _one_per_line(found: list) -> list:
    """A line's host reads as one finding: formatting a tensor (`f"{t}"`, `print(t)`) runs `__bool__`, `.item()`
    and `.tolist()` inside torch for the one line the user wrote; the first read names the others. A library
    line reached from two of the target's lines stays two findings (two calls to fix)."""
    first: dict = {}
    for f in found:
        g = first.setdefault((f.file, f.line, f.caller_file, f.caller_line, f.severity), f)
        if g is not f:
            g.message += f"{'; the same line also calls ' if '; the same line' not in g.message else ', '}`{f.op}`"
    return list(first.values())


def from_host_data(r) -> bool:
    """torch.tensor(data, device=D) with D a GPU: the data is copied from pageable host memory (the
    copy is not dispatched on its own; the lifted tensor is already on D). Empty data copies nothing."""
    return (r.op in ("aten.lift_fresh", "aten.lift_fresh_copy") and bool(r.inputs)
            and r.inputs[0].device.type != "cpu" and 0 not in r.inputs[0].shape)


def host_index(r) -> bool:
    """(CUDA scans) advanced indexing of a device tensor by a host index tensor: the op copies the index from
    pageable host memory to the device first, below the dispatcher (a sync, and capture raises on it)."""
    return (r.kind == "aten" and r.op in INDEX_PUT + ("aten.index",) and len(r.inputs) > 1
            and r.inputs[0].device.type == "cuda" and any(t.device.type == "cpu" and t.shape for t in index_tensors(r)))


# ops that move a 0-dim CPU operand to the device of the others with `.to(device)` (ATen's where_self_out),
# where binary ops would pass it as a kernel argument
SCALAR_COPIED = ("aten.where",)


def scalar_operand_copy(r) -> bool:
    """(CUDA scans) `torch.where(m, x, torch.tensor(-1e4))`: the 0-dim CPU operand is copied from pageable host
    memory to the device first, below the dispatcher (a sync, and capture raises on it)."""
    return (r.kind == "aten" and r.op in SCALAR_COPIED and bool(r.outputs) and r.outputs[0].device.type == "cuda"
            and any(m.device.type == "cpu" and not m.shape for m in r.inputs))


def _host_to_device(r) -> bool:
    """A copy from pageable host memory to the device: it syncs, and pageable-copy already says so."""
    if from_host_data(r) or host_index(r) or scalar_operand_copy(r):
        return True
    sides = copy_sides(r)
    return bool(sides) and sides[0].device.type == "cpu" and not sides[0].pinned and sides[1].device.type != "cpu"


@register("host-sync")
def device_values_into_host_tensors(ctx):
    """(CPU scan) a small tensor the target keeps on the host takes a tensor computed on the device
    (`self.tok_cpu.copy_(tok)`): on a GPU that is a device->host copy into pageable memory, which waits
    for the device; capture refuses it. Into a pinned buffer with non_blocking=True (an async output buffer)
    it is a captured memcpy node: no finding. (A CUDA scan sees the copy itself: device_to_host.)"""
    if ctx.cuda:
        return []
    host, pinned = host_tensors(ctx), pinned_host(ctx)
    hits = [r for r in in_place_updates(ctx, host) if from_device(ctx, r, host)
            and not (r.inputs[0].sid in pinned and non_blocking(r))] if host else []  # into pinned, async: a memcpy node
    return [ctx.finding("host-sync", g[0], op, len(g) / ctx.n_steps,
                        f"copies a device tensor into the host tensor `{host[g[0].inputs[0].sid]}`: on a GPU a "
                        "device->host copy into pageable memory that waits for the device (capture refuses it)",
                        fix=_DEVICE_FIX)
            for (_, _, op, _), g in ctx.per_site(hits).items()]
