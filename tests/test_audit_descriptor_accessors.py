"""cpu-side-effect: a descriptor's accessor counting reads, run by a library method's attribute read.

A policy class keeps `scale = Counted()` and reads `self.scale` in its `forward`; the descriptor's `__get__`
counts reads in the instance's `__dict__` and runs no torch op. The change is reported at the `__get__`
line with the target's call of the module as caller (not the library line itself), and the `__set__`,
which stores under a computed key but never ran in the step, is no site."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, module_target, table, write_target

LIB = """
import torch
from torch import nn


class Counted:
    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        obj.__dict__["{counter}"] = obj.__dict__.get("{counter}", 0) + 1  # LIBSITE
        return obj.__dict__[self.name]

    def __set__(self, obj, v):
        obj.__dict__[self.name] = v  # SETTER


class Policy(nn.Module):
    {attr} = Counted()

    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.{attr} = {value}

    def forward(self, x):
        {body}
"""

BODIES = ["return self.lin(x) * self.{attr}", "y = self.lin(x)\n        return y * self.{attr}",
          "s = self.{attr}\n        return torch.tanh(self.lin(x)) * s"]


@pytest.mark.parametrize("shape", range(len(BODIES)))  # the read on an op's line, on its own line, in a local
def test_descriptor_get_counting_reads_has_the_targets_call_as_caller(tmp_path, monkeypatch, shape):
    attr = random.choice(["scale", "temperature", "gain"])
    counter = random.choice(["reads", "n_get", "hits"])
    body = BODIES[shape].format(attr=attr)
    d = random.choice([4, 8])
    src = LIB.format(attr=attr, counter=counter, value=random.choice(["1.0", "0.5", "2.0"]), body=body)
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="descr")
    tpl = module_target(imports=f"from {mod} import Policy", init=f"        self.pol = Policy({d})",
                        step="        y = self.pol(self.x)  # SITE\n        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "descr.py", tpl, seed=random.randrange(2**31), d=d)
    bad = blocking(path, forget=mod)
    cse = bad[bad.category == "cpu-side-effect"]
    assert list(cse.line) == [marked_line(lib, "# LIBSITE")], table(bad)
    assert cse.iloc[0].caller_file.endswith(path.name) and int(cse.iloc[0].caller_line) == site, \
        cse[["caller_file", "caller_line"]].to_string()
