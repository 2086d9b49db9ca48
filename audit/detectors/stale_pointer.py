"""stale-input-pointer: the step reads a tensor it did not produce, at a new address each step.

A graph records device addresses. Inputs must live in static buffers that prepare() refills with
copy_; if prepare() (or anything outside the step) rebinds the tensor instead, replay reads the
buffer that existed at capture. We take, per step, the first call that reads each outside
storage, align those calls across steps and compare storage identity (StorageImpl, unique for
the whole scan because the tracer keeps a weak reference to every storage it saw) and address
(a view of one buffer at a host-chosen offset, e.g. a ring slot picked in prepare).

Persistent state (weights, caches: storages the target held before the previous step) read at a
different call is normal when the steps ran different calls (another expert: that is
data-dependent control, reported there). Where two steps made the same calls up to the read (they may part
later: another expert picked), the same call reading another persistent tensor is a host choice (double
buffers alternated, an adapter picked by a Python index, buffers swapped by the step itself, a window of a
token buffer sliced at the new position, as a generate loop feeds `tokens[:, prev:cur]`) and is reported too,
when it differs from the step before's read there (two steps that skipped other experts read other weights at
the k-th matmul, yet where they made the same calls up to it they read the same expert). Nor where the reading line
takes a loop index whose iterations a conditional skips (`for j, s in enumerate(strides): if frame % s == 0:
... cbs[j]`): the first run of the line is another iteration in another step, which data-dependent-control
reports at the conditional (`branches/skipped_iterations.py`).
On a CPU scan, an input prepare() rebinds to a device copy of a host buffer the object keeps reads one storage
every step (the move returns the buffer itself) and is found from the source (`host/moved_in_prepare.py`).
A call that in some step reads back a tensor an earlier audited step made is reading escaped allocations
(`audit/detectors/escaped_reads.py`): its other reads are the warmup's, and step-allocation reports it.
"""

from __future__ import annotations

from collections import defaultdict

from audit.scan.snapshot import state
from audit.detectors import register
from audit.detectors.branches import skipped_iterations
from audit.detectors.host import moved_in_prepare
from audit.detectors.tensors import empty_reads, escaped_reads
from audit.scan.sources.user_code import HIDDEN, frame_kind


def _first_reads(ctx, step):
    """(call key, input position) -> TensorMeta of the first read of each outside storage."""
    born = ctx.trace.born
    seen, out = set(), {}
    for key, r in ctx.sites(step).items():
        body = r.note.startswith("body:")  # a subclass's traced dispatch: its ops read the wrapper's inner tensors
        for j, m in enumerate(r.inputs):
            if r.in_step[j] or m.sid == 0 or m.sid in born or m.sid in seen or (body and m.ptr == 0) \
                    or empty_reads.holds_nothing(m):
                continue  # (an input with no elements reads no memory, wherever it lives)
            seen.add(m.sid)
            out[(key, j)] = (r, m)
    return out


def _holder(ctx, sids) -> str | None:
    """Name of the attribute that holds one of these storages now (e.g. 'ids' of the target)."""
    return next((name for name, t in state.tensor_attrs(ctx.trace.objects) if state.storage_id(t) in sids), None)


def _mutates(r) -> bool:
    """Whether the op may write an argument (in-place, out=); unknown schemas count as writing."""
    return getattr(getattr(r.func, "_schema", None), "is_mutable", True)


def _aligned_calls(ctx) -> dict:
    """step -> the call keys it ran before its op sequence first parted from the step before's: those calls
    are the same call in both (a divergence later in the step, another expert picked by the data, cannot
    have moved them), so a persistent tensor read there at another address was chosen on the host."""
    out = {}
    for s in ctx.complete:
        if s > 0 and s - 1 in ctx.complete:
            same = set()
            for a, b in zip(ctx.sites(s - 1), ctx.sites(s)):
                if a != b:
                    break
                same.add(b)
            out[s] = same
    return out


@register("stale-input-pointer")
def rebound_inputs(ctx):
    """An outside input's storage changes between steps: replay would read the captured one."""
    per = defaultdict(list)
    for s in ctx.complete:
        for k, v in _first_reads(ctx, s).items():
            per[k].append((s,) + v)
    held = ctx.trace.held
    aligned = _aligned_calls(ctx)
    groups, escaped = defaultdict(list), escaped_reads.reads_earlier_steps(ctx)
    diverged, memo = None, {}
    for (key, j), reads3 in per.items():
        if len(reads3) < 2 or len({(m.sid, m.ptr) for _, _, m in reads3}) < 2 or (key, j) in escaped:
            continue  # (a call reading back what earlier steps made: step-allocation's escape)
        at = {s: (m.sid, m.ptr) for s, _, m in reads3}
        if any(s > 0 and m.sid not in held[s - 1] for s, _, m in reads3):
            pass  # a storage the target did not hold the step before: rebound
        elif not any(s > 0 and key in aligned.get(s, ()) and at.get(s - 1, at[s]) != at[s] for s, _, m in reads3):
            continue  # persistent storages read at a misaligned call (or alike where aligned), not a rebound input
        else:
            diverged = skipped_iterations.diverged(ctx) if diverged is None else diverged
            if diverged and skipped_iterations.skipped_iteration(ctx, reads3[0][1], memo, j):
                continue  # another element of a table, picked by a loop index whose iterations a branch skips
        reads = [(r, m) for _, r, m in reads3]
        site, _, caller = ctx.site_key(reads[0][0])  # one finding per source line and calling line: a library
        groups[(site, caller)].append((j, reads))  # helper reading two rebound inputs from two lines is two fixes
    out = []
    for items in groups.values():
        j, reads = items[0]
        r, m = reads[0]
        holder = _holder(ctx, {x.sid for _, x in reads})
        name = f"`{holder}`" if holder else f"input {j}"
        ptrs = " -> ".join(hex(x.ptr) for _, x in reads[:3])
        what = "storage" if len({x.sid for _, x in reads}) > 1 else "address of one buffer"
        # an out= or in-place target is written, not read: the replay writes into the captured storage (a view's
        # output shares its input's storage too, but its schema is not mutable: a view writes nothing)
        written = any(x.sid in {o.sid for o in rr.outputs} and _mutates(rr) for rr, x in reads)
        verb, at = ("writes into", "at") if written else ("reads", "from")
        msg = (f"{verb} {name} ({list(m.shape)} {str(m.dtype).replace('torch.', '')}) {at} a different {what} "
               f"across steps ({ptrs}); it is not produced inside the step")
        fix = ("Allocate the input once as a static buffer and refill it with copy_ in prepare(); "
               + (f"do not rebind `{holder}`." if holder else "never rebind the tensor the step reads."))
        if (rebind := _rebinding(ctx, holder)) is not None:  # the step itself rebinds it: the fix is there
            file, line, _ = ctx.where(r)
            msg += f"; the step rebinds `{holder}` here, read at {ctx.rel(file)}:{line}"
            fix = f"Keep `{holder}` one static buffer and copy_ the chosen tensor into it instead of rebinding."
        out.append(ctx.finding("stale-input-pointer", rebind or r, r.op, len(items), msg, fix=fix))
    return out


def _rebinding(ctx, holder: str | None):
    """The step's own assignment of the module attribute that holds the input (`self.layer.A, self.layer.B =
    self.pool[name]` in the step, then `x @ self.A` in the layer): where the fix belongs, not the read."""
    for s in ctx.complete if holder else ():
        for r in ctx.steps[s]:
            if r.kind == "setattr" and r.stack and ".".join(filter(None, r.note.split("\x00"))) == holder:
                return r
    return None


@register("stale-input-pointer")
def inputs_moved_in_prepare(ctx):
    """CPU scans: an input prepare() rebinds to `.to(D)` of a host buffer it keeps; a GPU makes a new tensor per call."""
    if ctx.cuda or ctx.target is None or not ctx.complete:
        return []
    moved = moved_in_prepare.rebinds(ctx.target, follow=lambda f: frame_kind(f, ctx.trace.roots) != HIDDEN)
    held = {name: state.storage_id(t) for name, t in state.tensor_attrs(ctx.trace.objects)} if moved else {}
    out = []
    for path, file, line, src, keyed in moved:
        for name in [n for n in held if n.startswith(path + "[")] if keyed else [path]:
            if (found := _first_read(ctx, held.get(name))) is not None:
                out.append(_moved_finding(ctx, name, file, line, src, *found))
    return out


def _first_read(ctx, sid):
    """(record, input) of the step's first read of a storage it did not make, or None."""
    return next(((r, m) for s in ctx.complete for r in ctx.steps[s] for j, m in enumerate(r.inputs)
                 if sid and m.sid == sid and not r.in_step[j]), None)


def _moved_finding(ctx, path, file, line, src, r, m):
    """The finding at the step's first read `r` of `path`, naming prepare()'s line that rebinds it."""
    msg = (f"reads `{path}` ({list(m.shape)} {str(m.dtype).replace('torch.', '')}), which prepare() rebinds at "
           f"{ctx.rel(file)}:{line} to `{src}`: on a GPU each call makes a new device tensor, so replay reads "
           f"the copy made for the capture step (on the CPU the move returns the host buffer itself)")
    fix = (f"Allocate `{path}` once on the device and upload into it in prepare(): "
           f"`self.{path}.copy_(<host buffer>, non_blocking=True)`; do not rebind it.")
    return ctx.finding("stale-input-pointer", r, r.op, 1, msg, fix=fix)
