"""Grad mode and autocast left changed by the step, as a library's 'optimization' leaves them.

A step that switches grad off (`torch.set_grad_enabled(False)`) or autocast on
(`torch.set_autocast_enabled("cpu", True)`) and does not restore it changes the mode on the host only: a
replay never writes it, so whatever runs after a replayed step runs under the other mode. A cpu-side-effect
at the writing line (in a library too, with the target's call as caller). `with torch.no_grad()`,
`with torch.autocast(...)`, `with torch.inference_mode()` and a `@torch.no_grad()` step set and restore it.
"""

from __future__ import annotations

import random

import pytest
import torch

from site_util import at, blocking, install_library, library_hit, table, write_target

TPL = """
import torch
{imports}

class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        torch.set_grad_enabled(True)
        torch.set_autocast_enabled("cpu", False)

    {deco}
    def step(self):
        {body}
        self.out.copy_(h.float())
        return self.out

def make(device):
    return Target()
"""

LEAVES = {"grad": "torch.set_grad_enabled(False)  # SITE\n        h = torch.tanh(self.x @ self.w)",
          "autocast": 'torch.set_autocast_enabled("cpu", True)  # SITE\n        h = torch.tanh(self.x @ self.w)'}
RESTORES = {"no_grad": "with torch.no_grad():\n            h = torch.tanh(self.x @ self.w)",
            "autocast": 'with torch.autocast("cpu", dtype=torch.bfloat16):\n            h = torch.tanh(self.x @ self.w)',
            "inference": "with torch.inference_mode():\n            h = torch.tanh(self.x @ self.w)",
            "decorated": "torch.set_grad_enabled(False)\n        h = torch.tanh(self.x @ self.w)"}


def _own(tmp_path, body: str, deco: str = ""):
    return write_target(tmp_path / "own_modes.py", TPL, seed=random.randrange(2**31), d=random.choice([4, 8, 16]),
                        imports="", deco=deco, body=body)


@pytest.fixture(autouse=True)
def _modes_back():
    grad, amp = torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")
    yield
    torch.set_grad_enabled(grad)
    torch.set_autocast_enabled("cpu", amp)


@pytest.mark.parametrize("what", sorted(LEAVES))
def test_a_mode_left_changed_by_the_step_is_a_cpu_side_effect(tmp_path, what):
    path, site = _own(tmp_path, LEAVES[what])
    bad = blocking(path)
    assert len(at(bad, "cpu-side-effect", site)) == 1, table(bad)


@pytest.mark.parametrize("how", sorted(RESTORES))
def test_a_mode_set_and_restored_in_the_step_is_no_finding(tmp_path, how):
    path, _ = write_target(tmp_path / "own_modes.py", TPL, marker="def step", seed=random.randrange(2**31),
                           d=random.choice([4, 8]), imports="", body=RESTORES[how],
                           deco="@torch.no_grad()" if how == "decorated" else "")
    bad = blocking(path)
    assert not len(bad), table(bad)


LIB = """
import torch

def fast_math(x):
    torch.set_autocast_enabled(x.device.type, True)  # LIBSITE
    torch.set_autocast_dtype(x.device.type, torch.bfloat16)
    return x
"""


def test_a_library_leaving_autocast_on_is_found_with_the_callers_line(tmp_path, monkeypatch):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="amp")
    path, site = write_target(tmp_path / "target" / "lib_amp.py", TPL, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), imports=f"from {mod} import fast_math", deco="",
                              body="x = fast_math(self.x)  # SITE\n        h = torch.tanh(x @ self.w)")
    library_hit(blocking(path, forget=mod), "cpu-side-effect", lib, path, site)
