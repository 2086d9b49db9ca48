"""`Tensor.type(torch.LongTensor)` on a CPU scan: the legacy type names a device too.

`counts.type(torch.LongTensor)` (or `.type("torch.FloatTensor")`) converts to a *CPU* tensor type: on a GPU it is
a device->host copy that waits, the same read as `.cpu()`, written the way older dispatch code (fairseq,
DeepSpeed-MoE) writes it. On a CPU scan the tensor already is one, so nothing is dispatched; the argument says
where it goes, so the call is recorded as a host read (`torch.cuda.LongTensor` and a `torch.dtype` stay put).
"""

from __future__ import annotations

import contextlib

import torch

LABEL = "Tensor.type"


def cpu_type(t) -> bool:
    """A legacy tensor type of the CPU: the class `torch.LongTensor` or its name "torch.LongTensor"."""
    if isinstance(t, str):
        return t.startswith("torch.") and t.endswith("Tensor") and not t.startswith("torch.cuda.")
    return isinstance(t, type) and t.__module__ == "torch" and t.__name__.endswith("Tensor") and not t.is_cuda


def _type_wrapper(orig, active):
    def type(self, dtype=None, non_blocking=False, **kwargs):  # noqa: A001 (torch's name)
        tr = active()
        if (dtype is not None and tr is not None and not tr.host_depth and tr._step >= 0 and tr.device.type == "cpu"
                and self.device.type == "cpu" and cpu_type(dtype)):
            tr.record_event("host", LABEL, self)
        return orig(self, dtype, non_blocking, **kwargs)

    type.__wrapped__ = orig
    return type


def patch_to(patched, to_wrapper, active):
    """The context that wraps `Tensor.to` (to_wrapper, hooks') and `Tensor.type` (here) for one scan; active()
    is the running tracer (hooks' _ACTIVE)."""
    stack = contextlib.ExitStack()
    stack.enter_context(patched(torch.Tensor, "to", to_wrapper(torch.Tensor.to)))
    stack.enter_context(patched(torch.Tensor, "type", _type_wrapper(torch.Tensor.type, active)))
    return stack
