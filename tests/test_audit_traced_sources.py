"""Ops inside a `torch.jit.trace`d module are placed at the line the user wrote.

A traced module runs in the TorchScript interpreter, with no Python frame. Its graph nodes carry the Python
stack of the trace (`FILE(LINE): forward`, innermost first) rather than a scripted range (`File "F", line N`),
so the scan placed every op of a traced router on the target's call of it. The first frame of that stack outside
torch, the audit and the stdlib is the site: a `torch.nonzero` in the traced forward, or in a helper it calls, is
a host-sync there, with the target's call as caller; a traced module with no host read is no finding.
"""

from __future__ import annotations

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch
from torch import nn

def live_rows(x):
    return torch.nonzero(x > 0).shape[0]  # LIBSITE helper

class Router(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, x):
        if self.how == "forward":
            return x + torch.nonzero(x > 0).shape[0] * 0.0  # LIBSITE forward
        if self.how == "helper":
            return x + live_rows(x) * 0.0
        return torch.tanh(x) * 0.5  # LIBSITE clean

def traced(d, how):
    return torch.jit.trace(Router(how), torch.randn(1, d), check_trace=False)
"""


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("how", ["forward", "helper", "clean"])
def test_a_host_read_in_a_traced_module_is_at_its_source_line(tmp_path, monkeypatch, how):
    init = f'        self.tr = traced(self.w.shape[0], "{how}")'
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB, "tracedmod", "traced", "self.tr(self.x)", init=init)
    clean_or_hit(blocking(path, forget=mod), how, "host-sync", lib, path, site, marker=f"# LIBSITE {how}")
