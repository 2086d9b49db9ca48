"""Tensors a target keeps on the host on purpose (step counters, small host scalars), shared by the
cpu-side-effect rule (the step advances one in place) and the baked-host-value rule (a scalar derived
from one feeds a device op)."""

from __future__ import annotations

import functools
import inspect

import torch

from audit.detectors import _mutations


def cpu_attrs(ctx):
    """(storage id, 'owner.attr', attribute name, owner, tensor) for each CPU tensor attribute of the
    objects reachable from the target."""
    from audit.scan import state

    for path, obj in ctx.trace.objects:
        for name, t in list(getattr(obj, "__dict__", {}).items()):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                yield state.storage_id(t), f"{path}.{name}" if path else name, name, obj, t


def host_tensors(ctx) -> dict[int, str]:
    """Storage id -> 'owner.attr' of tensors the target keeps on the host on purpose: on a CUDA scan
    those on the CPU, on a CPU scan those whose class source puts them on the CPU (`device="cpu"`,
    `.cpu()`, `.to("cpu")`), since there every tensor is a host tensor. Computed once per scan."""
    if (cached := getattr(ctx, "_host_tensors", None)) is not None:
        return cached
    out = {}
    for sid, label, name, obj, t in cpu_attrs(ctx):
        if t.dim() > 1 or t.numel() > 64:
            continue  # counters and small host scalars; large host buffers are staging (pageable-copy)
        if ctx.cuda or any(_mutations.assigns_host_tensor(f, name, span) for f, span in class_spans(type(obj))):
            out[sid] = label
    ctx._host_tensors = out
    return out


@functools.lru_cache(maxsize=1024)
def class_spans(t: type) -> tuple:
    """(file, (first, last line)) of a class and its bases that have source."""
    spans = []
    for cls in t.__mro__:
        try:
            lines, start = inspect.getsourcelines(cls)
            spans.append((inspect.getsourcefile(cls), (start, start + len(lines))))
        except (OSError, TypeError):
            continue
    return tuple(x for x in spans if x[0])


def in_place_updates(ctx, host: dict[int, str]) -> list:
    """The step's in-place ops on those host tensors (`self.steps_cpu += 1`)."""
    return [r for r in ctx.all_records() if not r.nested and r.op.endswith("_") and r.inputs and r.inputs[0].sid in host]


def from_device(ctx, r, host: dict[int, str]) -> bool:
    """An in-place update of a host tensor that copies a device tensor into it (`self.tok_cpu.copy_(tok)`):
    a device->host copy, not host bookkeeping (on a CPU scan: a source the target does not keep on the host)."""
    if r.op != "aten.copy_" or len(r.inputs) < 2:
        return False
    src = r.inputs[1]
    return src.device.type != "cpu" if ctx.cuda else src.sid not in host


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
