"""Pinned host memory on a CPU-only torch: made in ordinary memory, remembered as asked for.

Serving code stages through page-locked memory (`torch.zeros(n, pin_memory=True)`, `t.pin_memory()`), in
__init__ and in the step (vLLM's `async_tensor_h2d` pins every step's metadata). A CPU-only torch raises on
both, which would stop a CPU scan at that line. While the target is built or prepared, a TorchFunctionMode
makes ordinary memory instead and notes each storage that was asked to be pinned; during the step (warmup
included) patched factories and `Tensor.pin_memory` do the same. The copy
rules then tell a pinned staging buffer from a pageable one by what the code did, not only by how its source
spells it (`pin_memory=self.pin`, `pin_memory=is_pin_memory_available()`), and a buffer pinned inside the step
by the step itself (its bytes are the Python data of the captured step: a replay copies them again).
On a CUDA build nothing is replaced: `is_pinned()` answers.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

from audit.scan.standins import pin_flags

__all__ = ["asked", "asked_sid", "forget", "holder", "lies_in", "note", "stand_in", "step_patches"]

_ASKED: dict[int, object] = {}  # storage _cdata -> the storage (held: the id stays unique until forget())


def note(t) -> None:
    """Marks t's memory as asked to be pinned (also from audit.scan.patches.host_sends: memory a GPU's arm of a
    probe pins, audit.scan.standins.pin_arms)."""
    if isinstance(t, torch.Tensor):
        with contextlib.suppress(Exception):  # no storage (a wrapper subclass): nothing to note
            s = t.untyped_storage()
            _ASKED[s._cdata] = s


class _StandIn(TorchFunctionMode):
    """`pin_memory=True` and `.pin_memory()` make ordinary host memory, noted as asked to be pinned."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.pin_memory:
            note(args[0])
            return args[0]
        if kwargs.get("pin_memory"):
            out = func(*args, **{**kwargs, "pin_memory": False})
            note(out)
            return out
        out = func(*args, **kwargs)
        if "pin_memory" in kwargs and pin_flags.probed():  # False only because this machine has no CUDA
            note(out)
        return out


# torch factories that make new memory from sizes or Python data (on the default device unless `device=` names one)
SIZED_FACTORIES = ("tensor", "empty", "zeros", "ones", "full", "arange", "empty_strided", "rand", "randn", "randint",
                   "randperm", "linspace", "eye")
_FACTORIES = SIZED_FACTORIES + ("empty_like", "zeros_like", "ones_like", "full_like")


def _unpinned(orig):
    def factory(*args, **kwargs):
        if not kwargs.get("pin_memory"):
            out = orig(*args, **kwargs)
            if "pin_memory" in kwargs and pin_flags.probed():  # False only because this machine has no CUDA
                note(out)
            return out
        out = orig(*args, **{**kwargs, "pin_memory": False})
        note(out)
        return out

    factory.__wrapped__ = orig
    return factory


def _pin_memory(self, *args, **kwargs):
    """In the step, as on a GPU: memory already pinned is returned as it is; anything else is copied into new
    (pinned) memory, so a kept host table's `self.blocks[i].pin_memory()` pins a copy, not the table."""
    if asked(self):
        return self
    out = self.clone()
    note(out)
    return out


def step_patches() -> list:
    """(owner, name, new) for a step on a CPU-only torch: `.pin_memory()` and the factories' `pin_memory=True`.
    Patched, not a TorchFunctionMode: a mode active in the step changes how TorchScript code dispatches."""
    out = [(torch.Tensor, "pin_memory", _pin_memory)]
    return out + [(torch, n, _unpinned(getattr(torch, n))) for n in _FACTORIES if hasattr(torch, n)]


@contextlib.contextmanager
def stand_in():
    """Around make() and prepare() of a CPU scan, on a machine with CUDA too (which would pin for real): the scan
    reports what a CPU-only machine reports."""
    with _StandIn():
        yield


def asked_sid(sid: int) -> bool:
    """Was the storage with this id (audit.scan.snapshot.state.storage_id) asked to be pinned?"""
    return sid in _ASKED


def asked(t: torch.Tensor) -> bool:
    """Was this tensor's storage asked to be pinned (on a CPU-only torch, where it is not)?"""
    try:
        return t.untyped_storage()._cdata in _ASKED
    except Exception:  # noqa: BLE001 - no storage
        return False


def holder(t: torch.Tensor):
    """The storage asked to be pinned that t's memory lies in, when t has a storage object of its own over it
    (`torch.from_numpy(buf.numpy())` in the step: on a GPU `is_pinned()` asks the driver about the address, so
    the new tensor is as pinned as the buffer it wraps), else None."""
    return next((s for s in _ASKED.values() if lies_in(t, s)), None)


def lies_in(t: torch.Tensor, storage) -> bool:
    """t's memory lies inside `storage`, which is another storage object than t's own (the same memory wrapped
    again: a numpy view, a buffer)."""
    try:
        mine = t.untyped_storage()
        start, end = t.data_ptr(), t.data_ptr() + mine.nbytes()
        return storage.data_ptr() <= start and end <= storage.data_ptr() + storage.nbytes() \
            and storage._cdata != mine._cdata
    except Exception:  # noqa: BLE001 - no storage
        return False


def forget() -> None:
    """At the start of a scan: the storages of an earlier scan's target are no concern of this one."""
    _ASKED.clear()
