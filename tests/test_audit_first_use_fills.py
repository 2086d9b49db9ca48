"""A library's module registry filled the first time a branch arm runs is lazy initialization, not step state.

einops fills `_loaded_backends` / `_type2backend` the first time `rearrange` sees a torch tensor. An fla-style
layer that switches to its chunked reference (which calls `rearrange`) once the context passes a bound fills them
in the first audited step that crosses it: that was reported as two blocking cpu-side-effects plus one with no
source line, beside the branch's data-dependent-control, the one place to act. A registry the step adds to on
every call is still a side effect.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, install_library, table, write_target

LIB = """
import torch

_BACKENDS = {}
_BY_TYPE = {}
_SEEN = {}


class Backend:
    pass


def get_backend(x):
    b = _BY_TYPE.get(type(x))
    if b is None:
        b = _BACKENDS.setdefault("torch", Backend())
        b.torch = torch
        _BY_TYPE[type(x)] = b
    return b


def rearrange(x):
    get_backend(x)
    return x.transpose(-1, -2).contiguous()


def remember(x):
    _SEEN[len(_SEEN)] = x.shape
    return x.transpose(-1, -2).contiguous()
"""

TARGET = """
import torch
from {mod} import {fn}

N = {n}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.x = torch.zeros(N, N)
        self.out = torch.zeros(N, N)
        self.ctx = 0

    def prepare(self, i):
        self.x.normal_()
        self.ctx = {start} + i

    def step(self):
        if self.ctx > {bound}:  # SITE
            y = {fn}(self.x) * 2.0
        else:
            y = self.x * 2.0
        self.out.copy_(y)
        return self.out


def make(device):
    return Target()
"""


@pytest.mark.parametrize("fn", ["rearrange", "remember"])
def test_a_registry_filled_in_a_new_arm_is_not_a_side_effect(tmp_path, monkeypatch, fn):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="einlike")
    start = random.randrange(10, 100)
    bound = start + (3 if fn == "rearrange" else 2)  # audited steps are i = 2..5: the arm runs from i = 4 (or 3)
    path, line = write_target(tmp_path / "target" / "first_use.py", TARGET, mod=mod, fn=fn, n=random.choice([4, 6]),
                              seed=random.randrange(2**31), start=start, bound=bound)
    bad = blocking(path, forget=mod)
    assert len(at(bad, "data-dependent-control", line)) == 1, table(bad)
    effects = bad[bad.category == "cpu-side-effect"]
    if fn == "rearrange":
        assert not len(effects), table(bad)
    else:  # one more key every step the arm runs
        assert len(effects) and effects.file.str.endswith(lib.name).all(), table(bad)
