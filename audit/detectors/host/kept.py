"""Tensors a target keeps on the host on purpose (step counters, small host scalars), shared by the
cpu-side-effect rule (the step advances one in place) and the baked-host-value rule (a scalar derived
from one feeds a device op)."""

from __future__ import annotations

import ast
import itertools

import torch

from audit.detectors.host import (attr_memory, dataclass_fields, factories as _factories, module_tensors,
                                 places as _places)
from audit.detectors.host.kept_before_move import kept_before_move
from audit.detectors.host.sent_temporaries import read_of_moved_temporary
from audit.detectors.host.places import class_spans
from audit.detectors.source import lookup, mutations
from audit.detectors.device import optimizer_steps
from audit.scan.snapshot.own_dict import own_dict
from audit.scan.sources.ast_nodes import all_nodes
from audit.scan.standins import pinned


def cpu_attrs(ctx):
    """(storage id, 'owner.attr', attribute name, owner, tensor) for each CPU tensor attribute of the
    objects reachable from the target."""
    from audit.scan.snapshot import state

    for path, obj in ctx.trace.objects:
        for name, t in list(own_dict(obj).items()):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                yield state.storage_id(t), f"{path}.{name}" if path else name, name, obj, t


def host_tensors(ctx) -> dict[int, str]:
    """Storage id -> 'owner.attr' of tensors the target keeps on the host on purpose: on a CUDA scan
    those on the CPU, on a CPU scan those whose class source puts them on the CPU (`device="cpu"`,
    `.cpu()`, `.to("cpu")`, or a factory naming no device in a class that puts other tensors on a device:
    `torch.tensor(0.01)` beside `torch.zeros(n, device=device)`, or in a plain class that places no tensor
    and whose attribute nothing else stores: `self.t = torch.tensor(t)` in a temperature processor), since
    there every tensor is a host tensor. Computed once per scan."""
    if (cached := getattr(ctx, "_host_tensors", None)) is not None:
        return cached
    out, ctx._pinned_host, ctx._read_host = {}, set(), set()
    for sid, label, name, obj, t in cpu_attrs(ctx):
        spans = class_spans(type(obj))
        if pinned.asked(t) or any(attr_memory.host_factory_attr(f, name, span) == "pinned" for f, span in spans):
            out[sid] = label  # a pinned staging buffer, of any size: host memory by design
            ctx._pinned_host.add(sid)
            continue
        placed = ctx.cuda or any(mutations.assigns_host_tensor(f, name, span) for f, span in spans) or \
            pageable_beside_device(obj, name, ctx) or \
            (any(kept_before_move(f, name, span) for f, span in spans) and not moved_elsewhere(obj, name))
        if t.dim() > 1 or t.numel() > 64 or not placed:  # counters and small host scalars only: large host
            if placed or dataclass_fields.field_memory(obj, name) == "pageable":  # buffers are staging
                ctx._read_host.add(sid)  # but a read of one is of host memory (read_kept)
            continue
        out[sid] = label
    ctx._read_host |= {sid for sid, *_ in dict_host_entries(ctx)}
    out.update(module_tensors.host_globals(ctx))  # `_DEFAULT_SPLITS = torch.tensor([8])` at module level
    ctx._read_host |= set(module_tensors.host_globals(ctx, any_size=True)) - set(out)
    out.update(optimizer_steps.host_steps(ctx))  # Adam's `state[p]["step"]` when neither capturable nor fused
    ctx._host_tensors = out
    return out


def dict_host_entries(ctx):
    """(storage id, 'owner.attr[key]', tensor) of CPU tensors a target keeps in a dict attribute (a processor's
    outputs kept as they came: `self.inputs = {"image_grid_thw": torch.tensor(grid), ...}`) that its class
    source makes with a host factory while it puts other tensors on a device: host memory on a GPU too, so a
    read of one (`.tolist()` each step) waits for no device work. A CUDA scan sees the device itself."""
    from audit.scan.snapshot import state

    for path, obj in [] if ctx.cuda else ctx.trace.objects:
        for name, d in list(own_dict(obj).items()):
            if not isinstance(d, dict) or len(d) > 64:
                continue
            for key, t in list(d.items()):
                if isinstance(key, str) and isinstance(t, torch.Tensor) and t.device.type == "cpu" and any(
                        _places.sends_to_device(f, span)
                        and attr_memory.host_factory_item(f, name, key, span) == "pageable"
                        for f, span in class_spans(type(obj))):
                    yield state.storage_id(t), f"{path}.{name}[{key!r}]" if path else f"{name}[{key!r}]", t


def moved_elsewhere(obj, name: str) -> bool:
    """A class of `obj`'s hierarchy puts attribute `name` on a device (`self.count = self.count.to(self.device)`
    in a subclass's lazy set-up) while another makes it with a host factory (a mixin's `torch.tensor(0)` in
    `__init__`): on a GPU it lives on the device once the step runs, whatever the factory said. A base class's
    `__init__` placing it on a device does not count when a subclass's `__init__` makes it again after calling
    `super().__init__()` (a host-scale variant of a quantizer): that assignment runs last."""
    remade = False
    for f, span in class_spans(type(obj)):  # most derived first
        init = _own_init(f, span)
        lines = None if init is None else (lookup.def_first_line(init), init.end_lineno)
        rest = [span] if lines is None else [(span[0], lines[0] - 1), (lines[1] + 1, span[1])]
        if any(mutations.device_attr(f, name, p) for p in rest) or \
                (lines is not None and not remade and mutations.device_attr(f, name, lines)):
            return True
        remade = remade or (init is not None and _assigned_after_super(init, name))
    return False


def _own_init(file: str, span: tuple[int, int]):
    """The `__init__` a class defines itself (the class whose source starts on `span[0]`), else None."""
    t = lookup.tree(file)
    cls = next((n for n in all_nodes(t) if isinstance(n, ast.ClassDef) and lookup.def_first_line(n) == span[0])
               if t is not None else (), None)
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None) if cls else None


def _assigned_after_super(init: ast.FunctionDef, name: str) -> bool:
    """`init` assigns `self.<name>` in a top-level statement after its `super().__init__()`."""
    body = init.body
    sup = next((i for i, st in enumerate(body) if isinstance(st, ast.Expr) and "super()." in ast.unparse(st.value)), None)
    return sup is not None and any(isinstance(st, ast.Assign) and any(
        isinstance(x, ast.Attribute) and x.attr == name for x in st.targets) for st in body[sup + 1:])


def pageable_beside_device(obj, name: str, ctx=None) -> bool:
    """Attribute `name` of `obj` is made by a factory naming no device or the CPU, not pinned, in a class that
    puts other tensors on a device (host memory on a GPU too) or, given the scan (`ctx`), in a plain class that
    names no device at all (`_places.unplaced`) or as a module's plain attribute, which `.to()` leaves where it
    is (`_places.left_by_to`), and no class of the hierarchy moves it there."""
    spans = class_spans(type(obj))
    return any(attr_memory.host_factory_attr(f, name, span) == "pageable" and (
        _places.sends_to_device(f, span) or (ctx is not None and (_places.unplaced(ctx, obj, name)
                                                                or _places.left_by_to(ctx, obj, name))))
        for f, span in spans) and not moved_elsewhere(obj, name)


def pinned_host(ctx) -> set[int]:
    """Storage ids of the host_tensors that are pinned staging buffers (asked for at run time, or so written)."""
    host_tensors(ctx)
    return ctx._pinned_host


def in_place_updates(ctx, host: dict[int, str]) -> list:
    """The step's in-place ops on those host tensors (`self.steps_cpu += 1`)."""
    return [r for r in ctx.all_records() if not r.nested and r.op.endswith("_") and r.inputs and r.inputs[0].sid in host]


def from_device(ctx, r, host: dict[int, str]) -> bool:
    """An in-place update of a host tensor that copies a device tensor into it (`self.tok_cpu.copy_(tok)`):
    a device->host copy, not host bookkeeping (on a CPU scan: a source the target does not keep on the host)."""
    if r.op != "aten.copy_" or len(r.inputs) < 2:
        return False
    src = r.inputs[1]
    if ctx.cuda:
        return src.device.type != "cpu"
    # on a CPU scan: not kept on the host, nor built from host data in the step (`torch.tensor(pending)`
    # refilling a pinned staging buffer is host work, not a read of the device)
    return src.sid not in host and src.sid not in host_data(ctx, r.step) and src.sid not in from_kept(ctx, r.step)


def advanced(ctx, host: dict[int, str]) -> dict[int, str]:
    """The host tensors the step updates in place (storage id -> name)."""
    return {r.inputs[0].sid: host[r.inputs[0].sid] for r in in_place_updates(ctx, host)}


# Ops whose listed outputs torch always makes in host memory, whatever the device of the inputs:
# PackedSequence.batch_sizes (`_pack_padded_sequence`'s second output) is a CPU tensor on a GPU too.
HOST_OUTPUTS = {"aten._pack_padded_sequence": (1,)}


def host_made(ctx, step: int) -> set:
    """Storage ids of one step's tensors that live in host memory on a GPU as well: HOST_OUTPUTS, and what
    ops compute from those alone (`batch_sizes[0]`). Reading them back waits for nothing."""
    cache = ctx.__dict__.setdefault("_host_made", {})
    if step not in cache:
        out = set()
        for r in ctx.steps[step]:
            if r.kind != "aten":
                continue
            out |= {r.outputs[i].sid for i in HOST_OUTPUTS.get(r.op, ()) if i < len(r.outputs)}
            if r.inputs and all(m.sid in out for m in r.inputs):
                out |= {m.sid for m in r.outputs}
        cache[step] = out
    return cache[step]


def host_born(recs) -> set:
    """Storage ids of tensors built from host data in one step (torch.tensor, from_numpy: `lift_fresh`).
    Empty ones are left out: copying nothing issues no copy, capture or not."""
    return {r.inputs[0].sid for r in recs if r.kind == "aten" and r.inputs
            and r.op in ("aten.lift_fresh", "aten.lift_fresh_copy") and 0 not in r.inputs[0].shape}


def host_factories(recs) -> set:
    """Storage ids of tensors a `torch.ones(...)`-style call made in host memory in this step (no
    device named, or the CPU), among those later sent somewhere with `.to(...)` or copied into another
    tensor (`buf.copy_(torch.zeros(n))`), themselves or through what ops compute from them alone (a
    segment-sum mask `torch.ones(t, t, dtype=torch.bool).tril().to(x.device)`), also together with other
    such factories (M-RoPE positions stacked from three `torch.arange` grids, then `.to(device)`)."""
    sent = {r.inputs[0].sid for r in recs if r.kind == "host" and r.note == "cpu?" and r.inputs}
    sent |= {r.inputs[1].sid for r in recs if r.kind == "aten" and r.op == "aten.copy_" and len(r.inputs) > 1}
    if not sent:
        return set()
    facs = factory_born(recs)
    if sent & facs:
        return facs
    # with host data lifted beside them (a sinc kernel `torch.where(t == 0, torch.tensor(1.0), t.sin() / t)`)
    return facs if sent & host_derived(recs, facs | host_born(recs)) else set()


def factory_born(recs) -> set:
    """Storage ids of tensors a torch factory made in host memory in this step: `torch.arange(t)`,
    `torch.ones(n)` naming no device, or naming the CPU (the source says so). On a GPU they live in host
    memory too, as does what ops compute from them alone (host_derived): reading one back waits for nothing."""
    return {r.outputs[0].sid for r in recs if r.kind == "aten" and r.outputs and r.stack
            and r.op.split(".")[1] in lookup.HOST_FACTORIES and 0 not in r.outputs[0].shape
            and _factories.factory_on_host(r.stack[-1][0].co_filename, r.stack[-1][1])}


def host_derived(recs, born: set) -> set:
    """`born` and the storages of calls that compute only on host data: a torch call whose tensor inputs
    are all in `born` (or made by that same call) leaves its results in host memory, as the torch
    helpers around host data do (`pad_sequence([torch.tensor(r) for r in rows])`, `torch.stack`,
    `t.long()`): a later `.to(D)` of them is a copy from pageable memory all the same."""
    out = set(born)
    if not out:
        return out
    moved = sent_at(recs)  # from its `.to(D)` on, a storage is the device copy (on a CPU scan the same memory)

    def host(m, i: int) -> bool:
        return m.sid in out and moved.get(m.sid, i + 1) > i

    calls = itertools.groupby(((i, r) for i, r in enumerate(recs) if r.kind == "aten" and r.stack),
                              key=lambda ir: tuple((id(c), n) for c, n in ir[1].stack))
    for _, call in calls:
        made, seen, ok = set(), False, True
        for i, r in call:
            for m in r.inputs:
                seen |= host(m, i)
                ok &= host(m, i) or m.sid in made
            made |= {m.sid for m in r.outputs}
        if ok and seen:
            out |= made
    # op by op too: `t.copy_(torch.tensor(vals) * 1)` is one call, whose copy_ has a device input; not through
    # what `.to(D)` sent at all (on a CPU scan the same storage goes on as the "device" copy)
    sent = {r.inputs[0].sid for r in recs if r.kind == "host" and r.note == "cpu?" and r.inputs}
    for r in recs:
        if r.kind == "aten" and r.inputs and r.op != "aten.copy_" and all(m.sid in out and m.sid not in sent
                                                                          for m in r.inputs):
            out |= {m.sid for m in r.outputs}
    return out


def sent_at(recs) -> dict[int, int]:
    """Storage id -> the index in `recs` of the first `.to(D)` sending it to the step's device, D not written
    as the CPU (`o = torch.zeros(n).to(v)`, `.to(x.device)`): a no-op on a CPU scan, a new device tensor on a
    GPU, so what the step does with that memory from there on is done on the device."""
    out: dict[int, int] = {}
    for i, r in enumerate(recs):
        if r.kind == "host" and r.note == "cpu?" and r.inputs and r.stack \
                and not lookup.names_cpu(r.stack[-1][0].co_filename, r.stack[-1][1]):
            out.setdefault(r.inputs[0].sid, i)
    return out


def built_on_device(recs) -> set:
    """Storage ids of tensors built from host data straight onto a device the source names
    (`torch.tensor([n], device=x.device)`): on a GPU they live in device memory, not host memory."""
    return {r.inputs[0].sid for r in recs if r.kind == "aten" and r.inputs and r.stack
            and r.op in ("aten.lift_fresh", "aten.lift_fresh_copy")
            and lookup.builds_on_device(r.stack[-1][0].co_filename, r.stack[-1][1])}


def host_data(ctx, step: int) -> set:
    """Storage ids of one step's tensors built from host data or by a torch factory on the host, what torch
    computed from those alone (host_born, factory_born, host_derived) and its host-only outputs (host_made):
    in host memory on a GPU too. Data
    built straight onto a device (built_on_device) is not: reading it back waits for the device."""
    cache = ctx.__dict__.setdefault("_host_data", {})
    if step not in cache:
        recs = ctx.steps[step]
        born = (host_born(recs) - built_on_device(recs)) | factory_born(recs)
        cache[step] = host_derived(recs, born) | host_made(ctx, step)
    return cache[step]


def from_kept(ctx, step: int) -> set:
    """Storage ids of the tensors the target keeps on the host on purpose and of what torch computed
    from those alone in one step (`self.seqlens_cpu.max()`, in a library too): host memory on a GPU."""
    cache = ctx.__dict__.setdefault("_from_kept", {})
    if step not in cache:
        cache[step] = host_derived(ctx.steps[step], set(host_tensors(ctx)))
    return cache[step]


def read_kept(ctx, step: int) -> set:
    """from_kept, plus the host tensors of any size the source puts in host memory (an attribute, a dataclass
    field its constructions pass a host factory, a module global) and what torch computed from those alone:
    host_tensors leaves large or 2-D ones out (an upload of such a buffer is a pageable copy), but reading one
    back (`self.image_grid_thw.tolist()` of a processor's CPU grid kept beside device tensors) waits for no
    device work on a GPU either."""
    host_tensors(ctx)
    if not ctx._read_host:
        return from_kept(ctx, step)
    cache = ctx.__dict__.setdefault("_read_kept", {})
    if step not in cache:
        cache[step] = host_derived(ctx.steps[step], set(host_tensors(ctx)) | ctx._read_host)
    return cache[step]


def kept_on_host(ctx, r) -> bool:
    """A host event (a read, a torch.save) whose tensor lives in host memory on a GPU as well: a CPU
    tensor on a CUDA scan, one the target keeps on the host on purpose (host_tensors, of any size: read_kept)
    or one computed from those alone, or one built on the host in this step (host_data). Reading it waits
    for no device work."""
    if not r.inputs:
        return False
    m = r.inputs[0]
    if ctx.cuda:
        return m.device.type == "cpu"
    if not (m.sid in read_kept(ctx, r.step) or m.sid in host_data(ctx, r.step)):
        return False  # (a temporary sent with `.to(D)` before the read: the read is of the device copy)
    return not read_of_moved_temporary(ctx.steps[r.step], r, sent_at(ctx.steps[r.step]))


def computes_on_host(ctx, r) -> bool:
    """An op whose tensor inputs all live in host memory on a GPU as well (host data built in the step,
    host-only outputs, tensors the target keeps on the host, what torch computed from those alone): it
    runs on the CPU, so even an op with a data-dependent size (`torch.repeat_interleave(torch.as_tensor(
    adapters), torch.as_tensor(lens))`, `torch.unique` of a Python list) reads no device value."""
    if not r.inputs:
        return False
    if ctx.cuda:
        return all(m.device.type == "cpu" for m in r.inputs)
    host = host_data(ctx, r.step) | read_kept(ctx, r.step)
    return all(m.sid in host for m in r.inputs)
