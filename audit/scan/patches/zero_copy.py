"""Tensors made over existing memory in the step: `torch.from_numpy(a)`, `torch.frombuffer(shm)`,
`torch.from_dlpack(x)`.

Over host memory (a numpy array, a shared-memory buffer) the result is host data, as `torch.tensor(data)`
is: it is passed through `aten.lift_fresh` (an identity op) so the trace records it at the user's line; moved
to the device it is a pageable copy, and its new storage each step is not a rebound input.
Over a torch tensor's own memory (`torch.from_dlpack(h)`, or a capsule `to_dlpack(h)` made in the step: an
activation handed to another framework and back) it is a view of that tensor: on a CUDA scan device
memory, on a CPU scan a tensor that only stands in for it. Its storage object is new each time, so it is
returned as `h.detach()` instead, a dispatched view the trace follows to the storage `h` lives in.
Over a pinned staging buffer's memory (`torch.from_numpy(self.stage_np)`, `self.stage_np = self.stage.numpy()`
of a tensor made with `pin_memory=True`) it is that buffer: on a GPU `is_pinned()` asks the driver about the
address, and the upload is the pinned copy a captured memcpy node repeats on replay, reading what prepare()
wrote there. It is returned as a view of the buffer's storage, made outside the trace, so the rules see the
buffer itself: found on a CPU scan among the storages asked to be pinned (audit.scan.standins.pinned), and on
either scan as the torch tensor the numpy array's `base` chain ends at (`tensor.numpy()` keeps it there). A
pageable host tensor reached so is that tensor too: its upload is the kept buffer's pageable copy, not fresh
host data.
A plain numpy array the target keeps as an attribute and refills in place (`self.mask_np[:] = ...` in prepare(),
then `torch.from_numpy(self.mask_np).to(D)` in the step) is host data made in the step, as above, recorded with
its values, and its lift is noted as such (`kept_array`): a copy of it reads that array's memory whenever it
runs, a replay's copy too, so the baked-host-value rule can excuse one that is only sent on
(audit/detectors/host/kept_arrays.py).
"""

from __future__ import annotations

import contextlib

import torch
import torch.utils.dlpack
from torch.utils._python_dispatch import _disable_current_modes

from audit.scan.snapshot.own_dict import own_dict
from audit.scan.standins import pinned

__all__ = ["TARGETS", "pinned_view", "watching"]

TARGETS = [(torch, "from_numpy"), (torch, "frombuffer"), (torch, "from_dlpack"), (torch.utils.dlpack, "from_dlpack")]
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


def kept_array(tr, arg, out: torch.Tensor) -> bool:
    """Whether `arg` (no torch tensor's memory) is held in an attribute of an object the target reaches
    (directly, or in a list, tuple or dict there) and `out`, its wrap, has more than one element (a 0-dim host
    tensor is a kernel's scalar on a GPU, read at launch, whoever keeps it)."""
    if out.numel() < 2 or isinstance(arg, torch.Tensor) or not hasattr(arg, "__array_interface__"):
        return False
    for _, obj in tr.trace.objects:
        try:
            values = list(own_dict(obj).values())
        except Exception:  # noqa: BLE001 - an object with no readable __dict__ holds nothing we can see
            continue
        for v in values:
            if v is arg or (isinstance(v, (list, tuple)) and any(x is arg for x in v)) or \
                    (isinstance(v, dict) and any(x is arg for x in v.values())):
                return True
    return False


def _import_wrapper(orig, capsules: dict, active):
    def wrapper(*args, **kwargs):
        if not _auditing(active()):
            return orig(*args, **kwargs)
        with _disable_current_modes():  # from_numpy dispatches its own lift_fresh: made here, recorded below
            out = orig(*args, **kwargs)
            if not isinstance(out, torch.Tensor):
                return out
            src = _torch_source(args[0] if args else kwargs.get("ext_tensor"), capsules)
            if src is None and (view := _over_buffer(out, args[0] if args else None)) is not None:
                return view  # the kept buffer itself, unrecorded: no host data made in the step
        if src is not None:
            return _view_of(src, out)
        if out.device.type == "cpu":
            tr = active()
            tr.kept_memory = bool(args) and kept_array(tr, args[0], out)
            try:
                out = torch.ops.aten.lift_fresh.default(out)
            finally:
                tr.kept_memory = False
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


def _over_buffer(out: torch.Tensor, arg):
    """A view of the kept buffer whose memory `out` wraps (made outside the trace), or None: one asked to be pinned
    (a CPU scan, where pinning is a stand-in), or the torch tensor a numpy array's `base` chain ends at
    (`self.stage.numpy()`, or a slice of it: on a GPU the really pinned buffer, whose address `is_pinned()` asks
    about)."""
    if out.device.type != "cpu":
        return None
    buf = pinned.holder(out)
    buf = _numpy_owner(arg, out) if buf is None else buf
    if buf is None:
        return None
    return torch.empty(0, dtype=out.dtype).set_(buf, (out.data_ptr() - buf.data_ptr()) // out.element_size(),
                                                out.shape, out.stride())


def _numpy_owner(arg, out: torch.Tensor):
    """The storage of the torch tensor `arg` (a numpy array) views, when out's memory lies in it, else None."""
    base = arg
    for _ in range(8):
        if isinstance(base, torch.Tensor) or getattr(base, "base", None) is None:
            break
        base = base.base
    if not isinstance(base, torch.Tensor) or base is arg:
        return None
    s = base.untyped_storage()
    return s if pinned.lies_in(out, s) else None


def pinned_view(tr, orig, data, args, kwargs):
    """`torch.as_tensor(a)` / `asarray(a)` in the step over a numpy array (or anything exposing the array
    interface) that shares its memory with the result, lying in a pinned buffer: that buffer's view, else None
    (the call then runs as traced)."""
    if not _auditing(tr) or not hasattr(data, "__array_interface__"):
        return None
    with _disable_current_modes():
        out = orig(data, *args, **kwargs)
        if not isinstance(out, torch.Tensor) or out.data_ptr() != data.__array_interface__["data"][0]:
            return None  # a copy (another dtype or device): host data of its own
        return _over_buffer(out, data)
