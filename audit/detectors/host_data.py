"""pageable-copy on a CPU scan: host data staged to the device inside the step.

On a GPU, `torch.tensor(data, device=x.device)` and `host_tensor.to(x.device)` copy from pageable
host memory, and capture raises on that copy (docs/hazards.md). A CUDA scan sees the copy itself
(pageable_copy.py). On a CPU scan every tensor is a host tensor and `.to(self.device)` copies
nothing, so the copy is invisible at run time: the trace still shows where host data became a
tensor (`lift_fresh`), and the source says whether it was sent to the step's device.
"""

from __future__ import annotations

import torch

from audit.detectors import register
from audit.detectors.host import (attr_memory, dataclass_fields, default_device, factories as _factories,
                                  helper_alloc, places, sends as _host_moves)
from audit.detectors.source import lookup, mutations
from audit.detectors.source.stored_back import stored_back
from audit.detectors.host.kept import class_spans, cpu_attrs, host_tensors, moved_elsewhere
from audit.detectors.host.staging_writes import on_kept_host
from audit.detectors.host.kept import factory_born, host_born, host_data, host_derived, host_factories, sent_at
from audit.detectors.host_sync import index_tensors
from audit.detectors.pageable_copy import FROM_DATA, PINNED_STEP
from audit.scan.patches import host_sends
from audit.scan.snapshot import state
from audit.scan.snapshot.own_dict import own_dict
from audit.scan.standins import pinned

TO_DEVICE = ("a tensor built from host data in the step is moved to the device: on a GPU that is a copy "
             "from pageable host memory, and capture raises 'Cannot copy between CPU and CUDA tensors ...'")
COPY_IN = ("host data built in the step is copied into a device tensor (`buf.copy_(host)`, a persistent buffer or "
           "one the step computed on the device): "
           "on a GPU that is a copy from pageable host memory, and capture raises 'Cannot copy between CPU and "
           "CUDA tensors ...'")
FIX = ("Build the tensor once outside the step (a persistent device buffer, refilled in prepare() with "
       "copy_), or use a device op (torch.full, fill_) for constants.")


def _src(r):
    code, line = r.stack[-1]
    return code.co_filename, line


def _lifted_onto_device(r) -> bool:
    """A lift_fresh the source sends to a device: `torch.tensor(data, device=D)` at the step's line, or on the
    line inside torch that made it (torch.nested's `jagged_from_list` builds the offsets with
    `torch.tensor(sizes, device=values.device)` under `torch.nested.nested_tensor(pieces, layout=torch.jagged)`)."""
    return lookup.builds_on_device(*_src(r)) or any(lookup.builds_on_device(*f) for f in r.torch_site)


INDEX = ("a Python list (or other host data) indexes a device tensor: on a GPU the index is built in host "
         "memory and copied from pageable memory to the device, and capture raises on that copy")
REFUSED = ("a Python list (or other host data) is the index of `index_select` on a device tensor: on a GPU the op "
           "refuses an index in host memory ('Expected all tensors to be on the same device'), eagerly and under "
           "capture alike")
FACTORY_INDEX = ("an index built in the step by torch factories naming no device (`torch.arange(n)`, and ops on those "
                 "alone) indexes a device tensor: on a GPU the index lives in host memory and is copied from pageable "
                 "memory to the device, and capture raises on that copy")
_INDEXING = {"aten.index", "aten.index_put_", "aten.index_put", "aten._index_put_impl_", "aten.index_select"}
# advanced indexing moves host indices to the tensor's device itself; index_select's device check refuses them
_COPIES_INDEX = _INDEXING - {"aten.index_select"}


def _host_indices(recs, born: set) -> list:
    """(lift_fresh record, indexing record, op) of host data that a later op of the step uses as an index into a
    tensor not born from host data (a device tensor on a GPU): `mask[allowed] = 0` with `allowed` a list. Host data
    the source sent on with `.to(D)` before the indexing op (nano-vllm's block table, `torch.tensor(rows,
    pin_memory=True).to(dev, non_blocking=True)`, then `k_cache[block_tables]`) indexes with the device copy on a
    GPU: the copy is the `.to(D)` line's finding, and the indexing op copies nothing."""
    lifted = {r.inputs[0].sid: r for r in recs if r.kind == "aten" and r.stack and r.inputs
              and r.op in ("aten.lift_fresh", "aten.lift_fresh_copy") and r.inputs[0].sid in born
              and len(r.inputs[0].shape) > 0}  # a 0-dim host tensor is a scalar operand: no copy
    moved, out = sent_at(recs), []
    for i, r in enumerate(recs):
        if r.kind == "aten" and r.op in _INDEXING and r.inputs and r.inputs[0].sid not in born:
            out += [(lifted.pop(t.sid), r, r.op) for t in index_tensors(r)
                    if t.sid in lifted and moved.get(t.sid, i) >= i]
    return out


def _factory_indices(recs, skip: set) -> list:
    """Index ops whose index is a tensor torch factories made on the host in the step, or ops computed from
    those alone (Qwen2-VL's vision rotary: `torch.arange(h)` row and column ids stacked, then
    `table[ids]` on a device table), into a tensor not in host memory (`skip`): on a GPU the index is copied
    from pageable memory to the device first. Reported at the indexing op, where the copy happens."""
    if not any(r.kind == "aten" and r.op in _COPIES_INDEX for r in recs):
        return []
    sent = {r.inputs[0].sid for r in recs if r.kind == "host" and r.note == "cpu?" and r.inputs and r.stack
            and not lookup.names_cpu(*_src(r))}  # `.to(D)` first: that copy is the finding (a no-op here)
    made = host_derived(recs, factory_born(recs)) - sent
    out = []
    for r in recs:
        if r.kind == "aten" and r.op in _COPIES_INDEX and r.inputs and r.stack and r.inputs[0].sid not in made | skip:
            if any(t.sid in made and len(t.shape) > 0 for t in index_tensors(r)):
                out.append(r)
    return out


STAGED = ("{name} (pageable host memory: made by a torch factory that names no device or the CPU, or sent there with "
          "`.cpu()` / `.to(\"cpu\")`) is copied to the device in the step: on a GPU capture raises 'Cannot copy between "
          "CPU and CUDA tensors ...'")
PINNED_STAGED = ("{name} is pinned in the step and copied to the device: on a GPU `.pin_memory()` makes a new pinned "
                 "copy, captured with the rows of the captured step, so every replay uploads those stale rows")
STAGED_FIX = ("Stage through a persistent pinned buffer (pin_memory=True) copied with non_blocking=True into a "
              "persistent device tensor, or keep the data on the device and refill it in prepare().")


def _host_attrs(ctx) -> dict[int, str]:
    """Storage id -> 'owner.attr' of the target's tensor attributes its class makes in pageable host memory
    (a factory naming no device or the CPU), or sends there (`.cpu()`, `.to("cpu")`), also as the members
    of a dict or list attribute (an offload hook's `{name: p.detach().to("cpu")}`)."""
    out = {sid: label for sid, label, name, obj, t in cpu_attrs(ctx)
           if not pinned.asked(t)  # asked to be pinned when made (`pin_memory=self.pin`): the source may not say
           and (((any(attr_memory.host_factory_attr(f, name, span) == "pageable" or _host_moves.moved_to_host(f, name, span)
                      for f, span in class_spans(type(obj))) or dataclass_fields.field_memory(obj, name) == "pageable")
                 and not moved_elsewhere(obj, name))
                or default_device.defaulted_to_cpu(ctx, obj, name, class_spans(type(obj))))}  # device="cpu" default
    out.update({sid: label for sid, label, name, obj, t in _host_moves.members(ctx)
                if any(_host_moves.moved_to_host(f, name, span) for f, span in class_spans(type(obj)))
                or (not pinned.asked(t) and any(_host_moves.moved_to_host(f, name, span, test=_host_moves.host_made(f))
                                               for f, span in class_spans(type(obj))))})  # a batch collated on the host
    out.update(helper_alloc.host_buffers(ctx))  # `self.cpu_cache = self._allocate(n, "cpu")`
    out.update(_sent_members(ctx, out))  # `state_dict = {n: p.to("cpu") ...}` in a function, kept by a hook
    return out


def _sent_members(ctx, known: dict) -> dict[int, str]:
    """Storage id -> label of the tensors the target sent to host memory while it was built (`.cpu()`, `.to("cpu")`
    in its source: audit.scan.patches.host_sends) and that a reachable object still holds, as an attribute or a member
    of a dict, list or tuple attribute, wherever that call was written; also of those a factory made naming no
    device and nothing moved since, when the target's class puts its other tensors on a device (a model built
    on the host, its state dict the weights map of offload hooks)."""
    out = {}
    root = ctx.trace.objects[0][1] if ctx.trace.objects else None
    placed = root is not None and any(places.sends_to_device(f, span) for f, span in class_spans(type(root)))
    kept = (lambda sid, t: (host_sends.sent(sid) or host_sends.born(sid)) and not pinned.asked(t)) if placed \
        else (lambda sid, t: host_sends.sent(sid) and not pinned.asked(t))  # pinned on a GPU's arm: pin_arms
    for path, obj in ctx.trace.objects:
        for name, v in list(own_dict(obj).items()):
            if name in ("_parameters", "_buffers"):  # Module.to(device) moves those, whatever made them, unless
                for k, t in list(v.items()):  # the source sent the module to the host (`self.tail.to("cpu")`)
                    if isinstance(t, torch.Tensor) and (sid := state.storage_id(t)) not in known \
                            and host_sends.sent(sid) and not host_sends.moved_on(sid) and not pinned.asked(t):
                        out[sid] = f"{path}.{k}" if path else k
                continue
            if isinstance(v, torch.Tensor) and moved_elsewhere(obj, name):
                continue  # `self.eos = self.eos.to(ids.device)` in the call: on the device from the first step on
            members = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, (list, tuple)) else [("", v)]
            for k, t in list(members)[:4096]:
                if isinstance(t, torch.Tensor) and (sid := state.storage_id(t)) not in known and kept(sid, t):
                    label = f"{path}.{name}" if path else name
                    out[sid] = f"{label}[{k!r}]" if k != "" else label
    return out


_GATHERS = ("aten.index", "aten.index_select", "aten.embedding", "aten.gather", "aten.take", "aten._embedding_bag",
            "aten.embedding_bag")


def _from_staged(recs, staged: dict, host: set = frozenset(), sent: set = frozenset()) -> dict[int, str]:
    """`staged` and the storages of ops whose tensor inputs are all among them, or host data built in the step
    (`host`: a length mask `torch.arange(n)[None] < self.lens_cpu[:, None]`), op by op (not call by call:
    inside a torch helper such as pack_padded_sequence, `torch.sort(lengths)` computes on the host while
    the helper's other ops touch device data): sid -> the attribute they come from. Rows gathered from a host
    table (`self.cpu_table[idx]`, `index_select`, `F.embedding(idx, self.cpu_weight)`) are host memory too, whatever
    the index: on a GPU it must be on the table's side for the op to run at all (`idx = self.ids.cpu()`, which a
    CPU scan cannot tell from the device tensor it came from)."""
    out, moved = dict(staged), sent_at(recs)
    for i, r in enumerate(recs):
        # read after its `.to(D)`: on a GPU the op reads the device copy (an offload hook's weight, moved by its
        # pre-forward, then used by the layer), so what it computes is device memory
        held = {m.sid for m in r.inputs if m.sid in out and moved.get(m.sid, i) >= i} if r.kind == "aten" else ()
        if r.kind == "aten" and r.op in _GATHERS and r.inputs and r.inputs[0].sid in held and len(r.inputs[0].shape):
            for m in r.outputs:  # rows read from a host table stay in host memory, whatever indexed it (below)
                out.setdefault(m.sid, out[r.inputs[0].sid])
        elif r.kind == "aten" and r.inputs and all(m.sid in held or m.sid in host for m in r.inputs):
            src = next((out[m.sid] for m in r.inputs if m.sid in held), None)
            for m in r.outputs if src is not None else ():
                out.setdefault(m.sid, src)
        elif r.kind == "aten" and (src := next((out[m.sid] for m in r.inputs if m.sid in held and m.sid in sent
                                                and len(m.shape) and m.dtype.is_floating_point), None)):
            # a layer the source put on the host (`self.tail.to("cpu")`) run on hidden states sent there: on a GPU an
            # op with such an operand of values (no scalar, no index, which some ops copy over) runs on the host, so
            # what it makes is host memory too
            for m, new in zip(r.outputs, r.new):
                if new:
                    out.setdefault(m.sid, src)
    return out


def _device_attrs(ctx) -> set[int]:
    """Storage ids of the target's tensor attributes its class makes on a device (`device=device`, `.to(D)`),
    and of the tensors held in its dict or list attributes made so."""
    return {sid for sid, _, name, obj, _ in cpu_attrs(ctx)
            if any(mutations.device_attr(f, name, span) for f, span in class_spans(type(obj)))} | \
        _host_moves.device_members(ctx) | helper_alloc.device_buffers(ctx)  # `{i: torch.zeros(n, device=device) ...}`


def _copied_in(r, derived: dict, device: set) -> bool:
    """`self.cur.copy_(self.bank[i])`: host rows copied into a persistent tensor the target's class makes on
    the device (on a GPU, a copy from pageable memory), or into a view of one made in the step
    (`self._lens[:n].copy_(seq_lens_cpu, non_blocking=True)` in a wrapper's plan()): the storage decides."""
    return (r.kind == "aten" and r.op == "aten.copy_" and bool(r.stack) and len(r.inputs) > 1
            and r.inputs[1].sid in derived and r.inputs[0].sid in device)


@register("pageable-copy")
def host_attrs_to_device(ctx):
    """CPU scans: `self.staging.to(D)` in the step, D not the CPU, of a tensor attribute the class made in
    pageable host memory, or of a tensor computed from such attributes alone (torch's own
    `sorted_indices.to(input.device)` after sorting the host `lengths`). A CUDA scan sees the copy itself."""
    if ctx.cuda:
        return []
    staged, device = _host_attrs(ctx), None
    placed = {sid for sid in staged if host_sends.sent(sid)}  # sent to the host by the source: meant to run there
    hits, names = [], {}
    for step, recs in enumerate(ctx.steps) if staged else ():
        # moved: sent by `.to(D)` (a no-op on a CPU scan); a later `.to(D)` of the same memory through another
        # tensor object (accelerate re-wrapping the moved weight in a Parameter) moves the device copy on a GPU
        derived, moved, sent_tids = _from_staged(recs, staged, host_data(ctx, step), placed), set(), set()
        for r in recs:
            sent = r.kind == "host" and r.note == "cpu?" and r.inputs and r.stack and r.inputs[0].sid in derived \
                and not lookup.names_cpu(*_src(r)) and not stored_back(*_src(r))  # moved once, in the warm-up
            if sent and r.inputs[0].sid in moved and r.inputs[0].tid not in sent_tids:
                continue
            if sent:
                moved.add(r.inputs[0].sid)
                sent_tids.add(r.inputs[0].tid)
            if not sent and r.op == "aten.copy_" and device is None:
                device = _device_attrs(ctx)
            if sent or (r.op == "aten.copy_" and _copied_in(r, derived, device) and r.inputs[1].sid not in moved):
                hits.append(r)
                sid = r.inputs[0 if sent else 1].sid  # `.to(D)` of it, or the source of `buf.copy_(it)`
                names[id(r)] = f"the host tensor `{derived[sid]}`" if sid in staged else \
                    f"a tensor computed from the host tensor `{derived[sid]}`"
    out = []
    for (_, _, op, _), g in ctx.per_site(hits).items():
        message, severity = _staged_message(g[0], names[id(g[0])])
        out.append(ctx.finding("pageable-copy", g[0], op, len(g) / ctx.n_steps, message, fix=STAGED_FIX,
                               severity=severity))
    return out


def _staged_message(r, name: str) -> tuple[str, str]:
    """(message, severity): a copy of a kept host tensor's rows the step pinned itself (`self.blocks[i].pin_memory()`,
    a new pinned copy on a GPU) raises nothing under capture, and every replay uploads the captured step's rows."""
    if r.op == "aten.copy_" and len(r.inputs) > 1 and pinned.asked_sid(r.inputs[1].sid):
        return PINNED_STAGED.format(name=name), "silent-corruption"
    return STAGED.format(name=name), "blocks-capture"


def _device_made(recs, not_device: set) -> set:
    """Storage ids of the step's tensors computed from a persistent tensor of the target that is not in host
    memory (a weight, a device buffer), or from such a result: device tensors on a GPU. A library's
    `t.copy_(torch.tensor(vals))` into one (an all-reduce stub writing back into the layer's output) is a
    copy from pageable memory as much as one into a persistent buffer."""
    out = set()
    for r in recs:
        if r.kind == "aten" and r.outputs and any(
                (m.sid in out) or (not made and m.sid not in not_device) for m, made in zip(r.inputs, r.in_step)):
            out |= {m.sid for m in r.outputs if m.sid not in not_device}
    return out


def _device_factories(recs) -> set:
    """Storage ids of the step's tensors a torch factory made on the step's device (`torch.zeros(v,
    device=dev)`, the source says so): device tensors on a GPU, like those _device_made finds."""
    return {r.outputs[0].sid for r in recs if r.kind == "aten" and r.outputs and r.stack
            and r.op.split(".")[1] in lookup.HOST_FACTORIES
            and _factories.factory_on_device(r.stack[-1][0].co_filename, r.stack[-1][1])}


@register("pageable-copy")
def host_data_to_device(ctx):
    """CPU scans: `torch.tensor(..., device=D)` and host-born tensors `.to(D)`, D not the CPU."""
    if ctx.cuda:
        return []
    hits = []
    host = host_tensors(ctx)  # a host tensor taking host data is no copy to the device
    pageable = None
    for recs in ctx.steps:
        born = host_born(recs) | host_factories(recs)
        on_device = {r.inputs[0].sid for r in recs if r.kind == "aten" and r.op in ("aten.lift_fresh", "aten.lift_fresh_copy")
                     and r.stack and r.inputs and _lifted_onto_device(r)}  # already sent: not host data
        built, born = born, host_derived(recs, born - on_device)  # built straight onto a device: not host memory
        made = set()
        if any(r.op == "aten.copy_" and len(r.inputs) > 1 and r.inputs[1].sid in born for r in recs):
            pageable = _host_attrs(ctx) if pageable is None else pageable
            made = _device_made(recs, born | set(host) | set(pageable)) | _device_factories(recs)
        # advanced indexing copies the index inside the op, where a CUDA scan sees it (host_sync.host_index):
        # reported there (`Z[:, li, lj]` after `li = torch.tensor([...])`); index_select refuses it where it is made
        seen = set()
        for lift, ix, op in _host_indices(recs, born):
            at = lift if op == "aten.index_select" else ix
            if not _lifted_onto_device(lift) and id(at) not in seen and at.stack and \
                    not on_kept_host(ctx, ix):  # a list indexing a host buffer the target keeps: host work
                seen.add(id(at))
                hits.append((at, REFUSED if op == "aten.index_select" else INDEX))
        fidx = _factory_indices(recs, born | set(host))
        if fidx:  # not into a tensor the target keeps in host memory (`self.bank = torch.randn(n, d)`)
            pageable = _host_attrs(ctx) if pageable is None else pageable
            kept = host_derived(recs, set(pageable))
            hits += [(r, FACTORY_INDEX) for r in fidx if r.inputs[0].sid not in kept]
        moved = sent_at(recs)  # host memory sent on with `.to(D)`: the device copy from there on
        for i, r in enumerate(recs):
            if not r.stack:
                continue
            if r.kind == "aten" and r.op in ("aten.lift_fresh", "aten.lift_fresh_copy") and r.inputs[:1] and \
                    r.inputs[0].sid in built:
                if _lifted_onto_device(r):
                    hits.append((r, FROM_DATA))
            elif r.kind == "host" and r.note == "cpu?" and r.inputs and r.inputs[0].sid in born and \
                    not lookup.names_cpu(*_src(r)):
                hits.append((r, TO_DEVICE))
            elif r.kind == "aten" and r.op == "aten.copy_" and len(r.inputs) > 1 and r.inputs[1].sid in born \
                    and moved.get(r.inputs[1].sid, i + 1) > i \
                    and r.inputs[0].sid not in born and r.inputs[0].sid not in host \
                    and (not r.in_step[0] or r.inputs[0].sid in made):
                hits.append((r, COPY_IN))  # `self.buf.copy_(torch.from_numpy(a))`: into a persistent buffer
    msg = {id(r): _pinned_in_step(r, m) for r, m in hits}
    return [ctx.finding("pageable-copy", g[0], op, len(g) / ctx.n_steps, msg[id(g[0])][0], fix=FIX,
                        severity=msg[id(g[0])][1])
            for (_, _, op, _), g in ctx.per_site(r for r, _ in hits).items()]


def _pinned_in_step(r, message: str) -> tuple[str, str]:
    """(message, severity): a copy from a buffer the step pinned itself (`torch.tensor(d, pin_memory=True)`,
    `.pin_memory()`; audit.scan.standins.pinned) raises nothing under capture; replay reuses the captured bytes."""
    src = r.inputs[0] if message == TO_DEVICE else r.inputs[1] if message == COPY_IN else None
    if src is not None and pinned.asked_sid(src.sid):
        return PINNED_STEP, "silent-corruption"
    return message, "blocks-capture"
