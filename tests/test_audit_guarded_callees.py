"""A wait one call below a device branch a CPU scan did not take (`if y.is_cuda: _drain(y)`): nothing ran in
the branch, so nothing was traced in the helper; the rule follows the call statically and names the helper's
line, with the target's call as the caller. A helper whose wait sits on the side only the CPU runs, or a
branch the CPU did take, stays clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch

{helpers}

class Scaler:
    def __init__(self):
        self.k = {k}

    def _settle(self, t):
        return t.sum().item()  # {meth_mark}

    def __call__(self, x):
        y = x * self.k
        if {guard}:
            {call}
        return y

def scale(x):
    return Scaler()(x)
"""
HELPERS = {
    "module": ("def _drain(t):\n    torch.cuda.synchronize()  # LIBSITE\n    return t", "_drain(y)"),
    "two deep": ("def _wait():\n    torch.cuda.current_stream().synchronize()  # LIBSITE\n\n"
                 "def _drain(t):\n    _wait()\n    return t", "_drain(y)"),
    "method": ("", "self._settle(y)"),
    "int of a sum": ("def _count(t):\n    return int(t.sum())  # LIBSITE", "n = _count(y)"),
    "cpu side only": ("def _drain(t):\n    if not t.is_cuda:\n        return t.tolist()  # LIBSITE\n    return t",
                      "_drain(y)"),
    "no wait": ("def _drain(t):\n    return t.clamp(-1, 1)  # LIBSITE", "_drain(y)"),
}
HAZARD = {"module", "two deep", "method", "int of a sum"}


@pytest.mark.parametrize("guard", ["y.is_cuda", "torch.cuda.is_available()", "y.device.type == 'cuda'"])
@pytest.mark.parametrize("helper", list(HELPERS))
def test_a_wait_inside_a_helper_called_from_an_untaken_device_branch(tmp_path, monkeypatch, helper, guard):
    helpers, call = HELPERS[helper]
    src = LIB.format(helpers=helpers, call=call, guard=guard, k=round(random.uniform(0.5, 2), 3),
                     meth_mark="LIBSITE" if helper == "method" else "not this one")
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "helper", "scale", "scale(self.x @ self.w)")
    kind = "hazard" if helper in HAZARD else "clean"
    clean_or_hit(blocking(path, forget=mod), kind, "host-sync", lib, path, site)


def test_a_helper_in_a_branch_the_cpu_took_is_not_read(tmp_path, monkeypatch):
    """The branch ran (an op inside it was traced): what its helpers did was traced too, and a wait the
    helper keeps for CUDA is the helper's own guarded branch, read as such; nothing is added here."""
    src = LIB.format(helpers="def _drain(t):\n    return t + 0  # LIBSITE", call="y = _drain(y)", guard="y.numel() > 0",
                     k=round(random.uniform(0.5, 2), 3), meth_mark="not this one")
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "helper", "scale", "scale(self.x @ self.w)")
    clean_or_hit(blocking(path, forget=mod), "clean", "host-sync", lib, path, site)
