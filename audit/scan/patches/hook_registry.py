"""Module hooks registered in the step: `mod.register_forward_hook(fn)` (pre, backward, and the
process-wide `register_module_forward_hook`) called by the target or a library while a step is audited.

A hook registered in every step and never removed piles up: the module runs one more hook each step (a
debug helper attaching a stats hook per call), which a capture records once and a replay never adds.
Each registration is a "hookreg" record at the registering line; its handle's id and a weak reference to
the hook table ride in the record's args, so the rule (audit/detectors/hook_registrations.py) can tell,
after the scan, which registrations were still in place: those removed in the step (a temporary hook)
leave nothing behind.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn
from torch.nn.modules import module as _module

import audit

__all__ = ["KIND", "alive", "watching"]

KIND = "hookreg"
_AUDIT = os.path.dirname(os.path.abspath(audit.__file__))  # the audit package
_METHODS = ("register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
            "register_full_backward_pre_hook", "register_backward_hook")
_GLOBAL = ("register_module_forward_hook", "register_module_forward_pre_hook", "register_module_full_backward_hook",
           "register_module_full_backward_pre_hook")


def alive(rec) -> bool:
    """Whether the hook a "hookreg" record registered is still in its table (not removed since)."""
    hid, ref = rec.args if len(rec.args) == 2 else (None, None)
    table = ref() if ref is not None else None
    return table is not None and hid in table


def _wrapper(tracer, label: str, orig, method: bool):
    def wrapper(*args, **kwargs):
        handle = orig(*args, **kwargs)
        caller = os.path.abspath(__import__("sys")._getframe(1).f_code.co_filename)
        if tracer._step < 0 or tracer.host_depth or caller.startswith(_AUDIT):
            return handle
        owner = tracer.path_of(args[0]) if method and args else "<all modules>"
        tracer.record_event(KIND, label, note=owner)
        ref = getattr(handle, "hooks_dict_ref", None)
        if tracer._records and ref is not None:
            tracer._records[-1].args = (handle.id, ref)
        return handle

    wrapper.__wrapped__ = orig
    return wrapper


@contextlib.contextmanager
def watching(tracer, patched):
    """Wraps the registration functions for one audited step."""
    with contextlib.ExitStack() as stack:
        for name in _METHODS:
            if hasattr(nn.Module, name):
                stack.enter_context(patched(nn.Module, name, _wrapper(tracer, name, getattr(nn.Module, name), True)))
        for name in _GLOBAL:
            if hasattr(_module, name):
                new = _wrapper(tracer, name, getattr(_module, name), False)
                stack.enter_context(patched(_module, name, new))
                if getattr(torch.nn.modules, name, None) is not None:
                    stack.enter_context(patched(torch.nn.modules, name, new))
        yield
