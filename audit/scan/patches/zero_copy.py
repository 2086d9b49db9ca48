"""Tensors made over existing memory without dispatching an op: `torch.frombuffer(shm)` and
`torch.from_dlpack(x)` in the step.

Over host memory (a numpy array, a shared-memory buffer) the result is host data, as `torch.tensor(data)`
is: it is passed through `aten.lift_fresh` (an identity op) so the trace records it at the user's line; moved
to the device it is a pageable copy, and its new storage each step is not a rebound input.
Over a torch tensor's own memory (`torch.from_dlpack(h)`, or a capsule `to_dlpack(h)` made in the step: an
activation handed to another framework and back) it is a view of that tensor: on a CUDA scan device
memory, on a CPU scan a tensor that only stands in for it. Its storage object is new each time, so it is
returned as `h.detach()` instead, a dispatched view the trace follows to the storage `h` lives in.
"""

from __future__ import annotations

import contextlib

import torch
import torch.utils.dlpack

__all__ = ["TARGETS", "watching"]

TARGETS = [(torch, "frombuffer"), (torch, "from_dlpack"), (torch.utils.dlpack, "from_dlpack")]
_EXPORTS = [(torch.utils.dlpack, "to_dlpack"), (torch, "to_dlpack"), (torch.Tensor, "__dlpack__")]


@contextlib.contextmanager
def watching(patched, originals: dict, active):
    """Installs the wrappers for one audited step (`active()` gives its tracer); a capsule torch exported
    in the step is remembered with its tensor until the step ends."""
    capsules: dict = {}  # id(capsule) -> (capsule, tensor): the capsule kept alive, so its id stays its own
    with contextlib.ExitStack() as stack:
        for owner, name in _EXPORTS:
            if hasattr(owner, name):
                orig = getattr(owner, name)
                stack.enter_context(patched(owner, name, _export_wrapper(orig, capsules, active)))
                if not isinstance(owner, type):
                    originals.setdefault(id(orig), (orig, getattr(owner, name)))  # `from torch.utils.dlpack import to_dlpack`
        for owner, name in TARGETS:
            if hasattr(owner, name):
                orig = getattr(owner, name)
                stack.enter_context(patched(owner, name, _import_wrapper(orig, capsules, active)))
                originals.setdefault(id(orig), (orig, getattr(owner, name)))
        try:
            yield
        finally:
            capsules.clear()



def _auditing(tr) -> bool:
    return tr is not None and not tr.host_depth and tr._step >= 0


def _export_wrapper(orig, capsules: dict, active):
    def wrapper(t, *args, **kwargs):
        cap = orig(t, *args, **kwargs)
        if _auditing(active()) and isinstance(t, torch.Tensor):
            capsules[id(cap)] = (cap, t)
        return cap

    wrapper.__wrapped__ = orig
    return wrapper


def _import_wrapper(orig, capsules: dict, active):
    def wrapper(*args, **kwargs):
        out = orig(*args, **kwargs)
        tr = active()
        if not _auditing(tr) or not isinstance(out, torch.Tensor):
            return out
        src = _torch_source(args[0] if args else kwargs.get("ext_tensor"), capsules)
        if src is not None:
            return _view_of(src, out)
        if out.device.type == "cpu":
            out = torch.ops.aten.lift_fresh.default(out)
        return out

    wrapper.__wrapped__ = orig
    return wrapper


def _torch_source(arg, capsules: dict):
    """The torch tensor whose memory a from_dlpack argument exposes, or None (a numpy array, a buffer)."""
    if isinstance(arg, torch.Tensor):
        return arg
    hit = capsules.get(id(arg))
    return hit[1] if hit is not None and hit[0] is arg else None


def _view_of(src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`src.detach()` when `out` shows src's memory as it is (a copy or a device move keeps its own result)."""
    same = (out.data_ptr() == src.data_ptr() and out.shape == src.shape and out.stride() == src.stride()
            and out.dtype == src.dtype and out.device == src.device)
    return src.detach() if same else out
