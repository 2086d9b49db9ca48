"""Where the memory of a wrapper tensor subclass comes from: its inner tensors.

torch's own wrapper subclasses (DTensor from `parallelize_module`, and any `__tensor_flatten__` subclass) stay opaque
to the tracer: an op on one runs its `__torch_dispatch__` below the tracer's mode, so the local tensors it makes
there are never seen being made, and a wrapper made in Python (`DTensor.from_local(h, mesh, placements)` in a
parallel style's input hook) is no op's output. Both read as tensors "not produced inside the step", at a new
address every step: a stale input pointer on every DTensor layer, and on whatever reads its `to_local()`.
A wrapper's own storage holds nothing (data_ptr 0); its memory is its inner tensors'. So an op's wrapper output
has its inner tensors' storages born at that op, and a wrapper input counts as produced in the step when every
inner tensor was (produced by an op, or its storage born in this step).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = ["in_step", "note_outputs"]


def _inner(t) -> list:
    try:
        names, _ = t.__tensor_flatten__()
    except Exception:  # noqa: BLE001 - a subclass whose flatten needs more than it has
        return []
    out = []
    for n in names:
        x = getattr(t, n, None)
        if isinstance(x, torch.Tensor):
            out.extend(_inner(x) if is_traceable_wrapper_subclass(x) else [x])
    return out


def in_step(tracer, tensors: list, inputs: tuple, flags: tuple) -> tuple:
    """The produced-in-step flags of an op's inputs, a wrapper input counting as produced when its inner tensors
    all were."""
    if not any(is_traceable_wrapper_subclass(t) for t in tensors):
        return flags
    born, step = tracer.trace.born, tracer._step
    out = list(flags)
    for j, t in enumerate(tensors):
        if not out[j] and is_traceable_wrapper_subclass(t):
            inner = [tracer._meta(x) for x in _inner(t)]
            out[j] = bool(inner) and all(m.tid in tracer._produced or born.get(m.sid, (None,))[0] == step
                                         for m in inner)
    return tuple(out)


def note_outputs(tracer, outs: list, idx: int, inputs: list = (), new: list | None = None) -> None:
    """The inner tensors of an op's wrapper outputs: produced by that op, their storages born there when first seen.
    An inner tensor the op was handed (one of its inputs, or an inner tensor of a wrapper input) was not made there:
    a dispatch that only views (`t`, `detach`, `alias` rewrapping a quantized weight's own data and scales) hands
    back the persistent tensors it got, which the step then reads from outside. A wrapper made of those alone
    allocates nothing (its own storage holds no memory): no allocation (`new`, the output's flags), none born."""
    given = {x._cdata for t in inputs for x in ((*_inner(t), t) if is_traceable_wrapper_subclass(t) else (t,))}
    for j, t in enumerate(outs):
        if not is_traceable_wrapper_subclass(t):
            continue
        if new is not None and (inner := _inner(t)) and all(x._cdata in given for x in inner):
            sid = tracer._meta(t).sid
            if tracer.trace.born.get(sid) == (tracer._step, idx):
                del tracer.trace.born[sid]
            new[j] = False
        for x in _inner(t):
            if x._cdata in given:
                continue
            m = tracer._meta(x)
            if tracer._fresh and m.sid:
                tracer.trace.born[m.sid] = (tracer._step, idx)
            tracer._produced.add(m.tid)
