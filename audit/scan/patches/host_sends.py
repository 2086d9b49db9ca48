"""Tensors a target sends to host memory while it is built or prepared: `.cpu()`, `.to("cpu")` in its source.

On a GPU each such call makes a new host copy of a device tensor; an offload hook keeps those copies and moves
them back to the execution device at every forward (accelerate's `cpu_offload` keeps `{n: p.to("cpu") ...}` as
its weights map). On a CPU-only torch the call returns the very tensor it was given, so a step's `.to(device)` of
the kept copy would read as a no-op on the device's own memory. While make() and prepare() run on a CPU-only
torch, such a call returns a new copy instead, as a GPU would, noted with the line that asked for it: the copy
rules then know that memory as pageable host memory. A device named by a variable that happens to be the CPU
here (`w.to(device)`) is the step's device, not a send.

Memory a torch factory makes naming no device (`nn.Linear(d, d)` built with no `device=`, outside a `with
torch.device(...)`) is host memory on a GPU too, until a `.to(<the step's device>)` or `.cuda()` moves it (a
module's `.to(device)` moves each tensor so): a model built on the host and offloaded as it is (accelerate's
`attach_align_device_hook(model, offload=True, weights_map=model.state_dict())`) keeps that memory in its hooks.
So is what ops compute from that memory alone while the target is built (`torch.rand(n, d) * 2 - 1`, a dataset's
table). Noted by storage, held weakly, with the line that made it (`born`).
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import weakref

import torch
from torch.overrides import TorchFunctionMode

import audit
from audit.scan.standins import pin_arms, pinned
from audit.scan.standins.pinned import SIZED_FACTORIES

__all__ = ["Sends", "born", "forget", "moved_on", "sent"]

_SENT: dict[int, tuple[object, str]] = {}  # storage _cdata -> (the storage, held; 'file:line' that sent it)
_BORN: dict[int, tuple[object, str]] = {}  # storage _cdata -> (a weak reference to it; 'file:line' that made it)
_ONWARD: set[int] = set()  # storage _cdata moved with `.to(<device>)` in make(): on a GPU a device copy
_FACTORIES = {getattr(torch, n) for n in SIZED_FACTORIES}
_NAMES_CPU = re.compile(r"""\.cpu\(|["']cpu["']""")
_AUDIT = os.path.dirname(os.path.abspath(audit.__file__))  # the audit package
_SKIP = (os.path.dirname(torch.__file__), _AUDIT)  # torch's and the audit's frames


def _asking_line() -> tuple[str, int] | None:
    """(file, line) of the innermost frame outside torch and this package: the code that called `.to`."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_SKIP):
        f = f.f_back
    return (f.f_code.co_filename, f.f_lineno) if f is not None else None


def _to_cpu(func, args, out) -> bool:
    """A `.cpu()`, or a `.to(...)` whose result is on the CPU."""
    return (func is torch.Tensor.cpu or func is torch.Tensor.to) and isinstance(out, torch.Tensor) \
        and out.device.type == "cpu" and bool(args) and isinstance(args[0], torch.Tensor)


class Sends(TorchFunctionMode):
    """Around make() and prepare() on a CPU-only torch: `.cpu()` / `.to("cpu")` return new memory, noted."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = self._made(func, args, kwargs or {})
        if isinstance(out, torch.Tensor) and pin_arms.pinned_arm():  # `w.cpu().pin_memory() if pin else w.cpu()`
            pinned.note(out)
        return out

    def _made(self, func, args, kwargs):
        out = func(*args, **kwargs)
        if func in _FACTORIES and kwargs.get("device") is None and not kwargs.get("pin_memory") \
                and isinstance(out, torch.Tensor):  # pinned staging is the legal form
            _note_born(out)
            return out
        if func not in _MOVES and isinstance(out, torch.Tensor) and _all_born(args) and not _live(_storage(out)):
            # `torch.rand(n, d) * 2 - 1`: computed from host memory alone, on the host. An entry whose storage
            # died (a freed temporary, `torch.randn(o, i)` before its `* 0.05`) whose address the allocator
            # hands to this output does not count: only a live one (an in-place op's own output) keeps its line
            _note_born(out)
            return out
        if func is torch.Tensor.cuda and args and isinstance(args[0], torch.Tensor) and args[0].layout == torch.strided:
            _BORN.pop(args[0].untyped_storage()._cdata, None)
        if not _to_cpu(func, args, out):
            return out
        at = _asking_line()
        if at is None or not _NAMES_CPU.search(linecache.getline(*at)):
            if func is torch.Tensor.to and args[0].layout == torch.strided and _names_device(args, kwargs):  # moved on a GPU
                _BORN.pop(args[0].untyped_storage()._cdata, None)
                _ONWARD.add(args[0].untyped_storage()._cdata)  # a sent buffer's module moved on: `Rope().to(device)`
            return out
        if out.untyped_storage()._cdata == args[0].untyped_storage()._cdata:  # the same memory here, new on a GPU
            out = out.clone()
        s = out.untyped_storage()
        _SENT[s._cdata] = (s, f"{at[0]}:{at[1]}")
        return out


_MOVES = (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.pin_memory)


def _all_born(args) -> bool:
    """Tensor arguments (also inside a list or tuple argument: `torch.stack(rows)`), all of them in memory a factory
    naming no device made (noted as born), and at least one."""
    sids = [_storage(t) for a in args for t in (a if isinstance(a, (list, tuple)) else (a,)) if isinstance(t, torch.Tensor)]
    return bool(sids) and all(sid is not None and born(sid) for sid in sids)


def _storage(t: torch.Tensor) -> int | None:
    """The storage id of a plain strided tensor; None for one without a storage of its own (sparse, a vmap
    `BatchedTensor` while `create_block_mask` builds a mask in make(), a wrapper subclass)."""
    try:
        return t.untyped_storage()._cdata if t.layout == torch.strided else None
    except (NotImplementedError, RuntimeError, TypeError):
        return None


def _note_born(t: torch.Tensor) -> None:
    at = _asking_line()
    if at is not None and _storage(t) is not None:  # sparse and other layouts have no one storage
        s = t.untyped_storage()
        _BORN[s._cdata] = (weakref.ref(s), f"{at[0]}:{at[1]}")


def _names_device(args, kwargs) -> bool:
    """A `.to(...)` that names a device (not only a dtype)."""
    try:
        return torch._C._nn._parse_to(*args[1:], **kwargs)[0] is not None
    except (TypeError, RuntimeError):
        return False


def _live(sid: int | None) -> bool:
    """A noted storage at this id that is still alive (the id is its address, reused once it is freed)."""
    ent = _BORN.get(sid) if sid is not None else None
    return ent is not None and ent[0]() is not None


def born(sid: int) -> str | None:
    """'file:line' of the factory naming no device that made this storage while the target was built, if no
    `.to(<device>)` moved it since, else None."""
    ent = _BORN.get(sid)
    return ent[1] if ent is not None and ent[0]() is not None else None


def moved_on(sid: int) -> bool:
    """Did a `.to(<the step's device>)` move this storage while the target was built (after it was sent there)?"""
    return sid in _ONWARD and sid in _SENT


def sent(sid: int) -> str | None:
    """'file:line' of the `.cpu()` / `.to("cpu")` that made this storage while the target was built, else None."""
    ent = _SENT.get(sid)
    return ent[1] if ent is not None else None


def forget() -> None:
    """At the start of a scan: an earlier target's host copies are no concern of this one."""
    _SENT.clear()
    _ONWARD.clear()
    _BORN.clear()
