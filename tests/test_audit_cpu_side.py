"""What a CPU scan traces on the CPU's side of a device test is not a hazard of the GPU step.

`if x.is_cuda: return kernel(x)` followed by a reference path that reads `int(z.abs().max())`: the CPU
scan runs the reference and traces the read, but a GPU runs the kernel and never reads. The finding stays
as info naming the test; a read before the test, or after a test that does not settle the GPU's side (an
MPS workaround), stays a hazard.
"""

from __future__ import annotations

import random

import pytest

from site_util import HELPER_LIB, HELPER_TARGET, helper_reads, install_library, marked_line, write_target

FORMS = {  # (helper body, the read is on the CPU's side only)
    "early-return": ("if z.is_cuda:\n        return z * 2\n    n = 1 + int(z.abs().max())  # LIBSITE\n"
                     "    return z[:, :n] * 2", True),
    "else-side": ('if z.device.type != "cpu":\n        out = z * 2\n    else:\n'
                  "        n = 1 + int(z.abs().max())  # LIBSITE\n        out = z[:, :n] * 2\n    return out", True),
    "cpu-body": ('if z.device.type == "cpu":\n        k = len(z.abs().sum(-1).tolist())  # LIBSITE\n'
                 "        return z * (1 + 0 * k)\n    return z * 2", True),
    "expression": ("n = z.shape[-1] if z.is_cuda else 1 + int(z.abs().max())  # LIBSITE\n    return z[:, :n]", True),
    "expression-both-read": ("n = int(z.abs().sum()) if z.is_cuda else 1 + int(z.abs().max())  # LIBSITE\n"
                             "    return z[:, :min(n, z.shape[-1])]", False),
    "read-first": ("n = 1 + int(z.abs().max())  # LIBSITE\n    if z.is_cuda:\n        return z * 2\n"
                   "    return z[:, :n] * 2", False),
    "mps-workaround": ('if z.device.type == "mps":\n        return z * 2\n'
                       "    n = 1 + int(z.abs().max())  # LIBSITE\n    return z[:, :n] * 2", False),
}

LIB, TARGET = HELPER_LIB, HELPER_TARGET


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_read_on_the_cpus_side_of_a_device_test_is_info(tmp_path, monkeypatch, form):
    body, cpu_only = FORMS[form]
    hit = helper_reads(tmp_path, monkeypatch, LIB.format(body=body), "cpu_side_lib")
    if cpu_only:
        assert (hit.severity == "info").all() and hit.message.str.contains("on the CPU only").all(), hit.to_string()
    else:  # (a GPU side that reads too is read from the source: a second finding on the line)
        assert (hit.severity == "blocks-capture").all() and not hit.message.str.contains("CPU only").any(), \
            hit.to_string()


STALE = """
import torch
from {mod} import helper


class Target:
    def __init__(self):
        self.x = torch.zeros(2, {d})
        self.out = torch.zeros(2, {d})

    def prepare(self, i):
        self.x = torch.randn(2, {d})  # rebinds the step's input

    def step(self):
        y = helper(self.x)  # SITE
        self.out[:, :y.shape[1]].copy_(y)
        return self.out


def make(device):
    return Target()
"""


def test_a_stale_input_read_on_the_cpus_side_stays_a_hazard(tmp_path, monkeypatch):
    """The rebound input is stale whichever side reads it: a GPU's kernel reads it too."""
    import sys

    import audit

    src = "import torch\n\n\ndef helper(y):\n    if y.is_cuda:\n        return torch.tanh(y) * 2\n" \
          "    return torch.tanh(y) * 3  # LIBSITE\n"
    mod, lib = install_library(tmp_path, monkeypatch, src, "cpu_side_lib")
    path, _ = write_target(tmp_path / "target" / "stale_target.py", STALE, mod=mod, d=random.choice([4, 8, 16]))
    try:
        df = audit.scan(f"{path}:make", device="cpu").df
    finally:
        sys.modules.pop(mod, None)
    stale = df[df.category == "stale-input-pointer"]
    assert list(stale.line) == [marked_line(lib, "# LIBSITE")], df.to_string()  # read on the CPU's side
    assert set(stale.severity) == {"silent-corruption"}, df.to_string()
