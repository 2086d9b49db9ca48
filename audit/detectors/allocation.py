"""step-allocation: storage created inside the step, and storage that outlives it.

A capture serves the step's allocations from the graph's private pool, so allocating is legal
(info). The danger is escape: a tensor created in step k and read by step k+1 (typically
`self.state = f(self.state)`). At capture the attribute is rebound to the pool buffer once; every
replay then reads the buffer the capture read, not the one the previous replay wrote.
"""

from __future__ import annotations

from audit.scan.snapshot import state
from audit.detectors import register
from audit.detectors.tensors import empty_reads, moved_home, stored_escapes


@register("step-allocation")
def allocations(ctx):
    """Every call site that creates new storage during the step (info; graph pools handle it)."""
    recs = [r for r in ctx.all_records() if not r.nested and any(r.new)]
    out = []
    for (_, _, op, _), group in ctx.per_site(recs).items():
        n = sum(sum(r.new) for r in group)
        m = next(o for o, new in zip(group[0].outputs, group[0].new) if new)
        msg = f"allocates {list(m.shape)} {str(m.dtype).replace('torch.', '')} inside the step"
        out.append(ctx.finding("step-allocation", group[0], op, n / ctx.n_steps, msg))
    return out


def attribute_sids(ctx) -> dict[int, str]:
    """storage id -> 'owner.attr' for tensors held by reachable objects now (after the scan); computed once."""
    if (cached := getattr(ctx, "_attribute_sids", None)) is None:
        cached = ctx._attribute_sids = {state.storage_id(t): name for name, t in state.tensor_attrs(ctx.trace.objects)}
    return cached


def escapes(ctx) -> dict:
    """(alloc step, alloc index) -> the first record of a later step that reads that allocation
    (computed once per scan: step-allocation reports them, cpu-side-effect defers to them)."""
    if (cached := getattr(ctx, "_escapes", None)) is not None:
        return cached
    born = ctx.trace.born
    moved = moved_home.moved_home(ctx)
    out: dict = {}
    for s, recs in enumerate(ctx.steps):
        for r in recs:
            for m in r.inputs:
                b = born.get(m.sid)
                if b is not None and b[0] < s and b not in out \
                        and not moved_home.rereads_host_copy(ctx, r, m.sid, b[0], moved):
                    out[b] = r  # (a later `.to("cpu")` of what its step moved home reads the host copy)
    ctx._escapes = out
    return out


def escape_lines(ctx) -> set:
    """(file, line) of the allocations that escaped into a later step (reported here as silent)."""
    return {ctx.where(ctx.steps[s][i])[:2] for s, i in escapes(ctx)}


def tensor_storages(fp, out: set) -> set:
    """The storages of the tensors inside a state fingerprint (("tensor", (storage, ...)) entries)."""
    if isinstance(fp, tuple):
        if len(fp) == 2 and fp[0] == "tensor" and isinstance(fp[1], tuple) and len(fp[1]) == 5:
            out.add(fp[1][0])
        else:
            for x in fp:
                tensor_storages(x, out)
    return out


def escaped_members(ctx, change) -> bool:
    """A container changed only in which tensors it holds, and every tensor it newly holds was allocated in
    the step and read by a later one (`t = torch.tanh(h); self.slots["h"] = t`): step-allocation reports the
    allocation, wherever the slot is rebound. A container whose kept members moved (a deque window) is not:
    the shift is a cpu-side-effect of its own."""
    if not change.tensor_members_only or shifted_members(change):
        return False
    new = tensor_storages(change.after, set()) - tensor_storages(change.before, set())
    found, born = escapes(ctx), ctx.trace.born
    return bool(new) and all(born.get(sid) in found for sid in new)


def escaped_slot(ctx, change, key) -> bool:
    """The container's element at `key` took only tensors allocated in the step that a later step reads
    (`outs[-1] = x0`): step-allocation reports that store, also when the container's other members shifted."""
    new = tensor_storages(state._element(change.after, key), set()) - tensor_storages(change.before, set())
    found, born = escapes(ctx), ctx.trace.born
    return bool(new) and all(born.get(sid) in found for sid in new)


def _keys_of(fp, prefix: tuple = ()) -> dict:
    """storage -> the key paths of the container's elements that hold it (a list's positions, a dict's keys,
    followed into nested containers: a per-request dict of history lists, `reqs["r0"]["hist"][1]`)."""
    out: dict = {}
    if state._is_container(fp):
        for k, v in state._items(fp):
            for sid, paths in (_keys_of(v, prefix + (k,)) if state._is_container(v) else
                               {sid: {prefix + (k,)} for sid in tensor_storages(v, set())}).items():
                out.setdefault(sid, set()).update(paths)
    return out


def shifted_members(change) -> bool:
    """A tensor the container held before the step sits under another key after it: a history rotated by
    the host (`outs[i] = outs[i + 1]` before `outs[-1] = x0`, a full deque appended to). Replay rebinds no
    slot, so the older tensors stay where the capture left them: Python state (cpu-side-effect), beside the
    escape of the tensor the step added (step-allocation)."""
    before, after = _keys_of(change.before), _keys_of(change.after)
    return any(sid in after and after[sid] != keys for sid, keys in before.items())


@register("step-allocation")
def escaped_into_state(ctx):
    """A tensor allocated in one audited step and read by a later one: silent under replay."""
    found = escapes(ctx)
    if not found:
        return []
    holders = attribute_sids(ctx)
    born = ctx.trace.born
    by_site: dict = {}
    for (s, i), reader in found.items():
        alloc = ctx.steps[s][i]
        if empty_reads.allocates_nothing(alloc):
            continue  # no element to go stale (an empty padding slot kept for the next step)
        by_site.setdefault(ctx.site_key(alloc), []).append((alloc, reader))  # per calling line too
    held_at = {}
    for sid, attr in holders.items():
        b = born.get(sid)
        if b is not None:
            a = ctx.steps[b[0]][b[1]]
            held_at[ctx.site_key(a)] = attr
    out, stored = [], set()
    for key, pairs in by_site.items():
        alloc, reader = pairs[0]
        rf, rl, _ = ctx.where(reader)
        attr = held_at.get(key)
        via = f" (held in `{attr}`)" if attr else ""
        msg = (f"allocated in step {alloc.step} and read again in step {reader.step} by {reader.op} at "
               f"{rf}:{rl}{via}: the tensor escaped into state, replay would keep reading the captured buffer")
        fix = ("Preallocate this state once and update it in place (copy_, out=, index_copy_) instead of "
               f"rebinding{' `' + attr + '`' if attr else ''} to a new tensor each step.")
        at = alloc
        if (site := stored_escapes.store_site(ctx, alloc, attr)) is not None:  # made in a callee, kept here
            if site in stored:
                continue
            stored.add(site)
            af, al, _ = ctx.where(alloc)
            at, msg = site, msg.replace("allocated in step", f"allocated at {af}:{al} in step", 1) + \
                f"; the step keeps it in `{attr}` here"
            fix = f"Preallocate `{attr}` once and copy_ the new value into it here instead of rebinding it."
        out.append(ctx.finding("step-allocation", at, key[1], len(pairs) / ctx.n_steps, msg,
                               severity="silent-corruption", fix=fix))
    return out
