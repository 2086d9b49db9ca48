"""`RNNBase.flatten_parameters()` called in the step: on a GPU it re-packs the weights every call.

With cuDNN, `flatten_parameters` runs `torch._cudnn_rnn_flatten_weight`, which allocates a fresh weight
buffer, copies every weight into it and re-points each parameter (`set_`) at a view of it; it does so on
every call, already flat or not. On a CPU tensor (a CPU scan) it returns before any of that, so nothing
reaches the dispatcher. Each call in an audited step is a "rnnflat" record at the calling line, carrying the
module's path; the rule (audit/detectors/rnn_flatten.py) decides whether a GPU would re-pack.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
from torch import nn

import audit

__all__ = ["KIND", "watching"]

KIND = "rnnflat"
_AUDIT = os.path.dirname(os.path.abspath(audit.__file__))


def _would_repack(mod, scan_device) -> bool:
    """The checks flatten_parameters makes before re-packing: every weight a tensor of one floating dtype, none
    aliasing another (aliased weights take torch's copying path and are left alone), on the GPU; on a CPU scan,
    weights on the scan's device stand for the GPU weights they would be."""
    if not torch.backends.cudnn.enabled:
        return False  # torch._use_cudnn_rnn_flatten_weight() is off: a no-op
    ws = list(getattr(mod, "_flat_weights", ()) or ())
    names = getattr(mod, "_flat_weights_names", ())
    if not ws or len(ws) != len(names) or not all(hasattr(w, "data_ptr") for w in ws):
        return False
    if not (ws[0].is_cuda or ws[0].device.type == getattr(scan_device, "type", None) == "cpu"):
        return False
    if len({w.dtype for w in ws}) != 1 or not ws[0].is_floating_point():
        return False
    return len({w.data_ptr() for w in ws}) == len(ws)


def _wrapper(tracer, orig):
    def flatten_parameters(self, *args, **kwargs):
        caller = os.path.abspath(sys._getframe(1).f_code.co_filename)
        if tracer._step >= 0 and not tracer.host_depth and not caller.startswith(_AUDIT) and _would_repack(self, tracer.device):
            tracer.record_event(KIND, "RNNBase.flatten_parameters", self._flat_weights[0],
                                note=tracer.path_of(self) or type(self).__name__)
        return orig(self, *args, **kwargs)

    flatten_parameters.__wrapped__ = orig
    return flatten_parameters


@contextlib.contextmanager
def watching(tracer, patched):
    """Wraps `nn.RNNBase.flatten_parameters` (LSTM, GRU, RNN) for one audited step."""
    with patched(nn.RNNBase, "flatten_parameters", _wrapper(tracer, nn.RNNBase.flatten_parameters)):
        yield
