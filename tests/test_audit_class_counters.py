"""cpu-side-effect on a class a step instantiates and drops.

A library processor whose metaclass counts instances on the class (`cls.instances = ... + 1` in the
metaclass's `__call__`) changes Python state at every `MinP(0.05)` in the step, though no object of the
target holds the instance: the classes the state modules define are snapshotted too. The site is the
metaclass's statement, the caller the target's line that instantiates the class (not the line that
calls the instance, whose class's own `__call__` shares the name and file)."""

from __future__ import annotations

import random
import sys
import textwrap

from site_util import blocking, marked_line, table, write_target

LIB = """
import torch


class Counted(type):
    def __call__(cls, *args, **kwargs):
        cls.{attr} = getattr(cls, "{attr}", 0) + 1  # LIBSITE
        return super().__call__(*args, **kwargs)


class {name}(metaclass=Counted):
    def __init__(self, p):
        self.p = p

    def __call__(self, x):
        return x.clamp(-self.p, self.p)
"""

TARGET = """
import torch
from {mod} import {name}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {d})
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    @torch.no_grad()
    def step(self):
        proc = {name}(2.0)  # SITE
        self.out.copy_(proc(self.x @ self.w))
        return self.out

def make(device):
    return Target()
"""


def test_a_metaclass_counter_is_found_with_the_instantiating_line_as_caller(tmp_path, monkeypatch):
    tag = random.randrange(10**9)
    mod, name, attr = f"proc_lib_{tag}", f"Clip{tag}", random.choice(["instances", "made", "n_built"])
    libdir = tmp_path / "site"
    libdir.mkdir()
    lib = libdir / f"{mod}.py"
    lib.write_text(textwrap.dedent(LIB).format(name=name, attr=attr))
    monkeypatch.syspath_prepend(str(libdir))
    (tmp_path / "target").mkdir()
    path, site = write_target(tmp_path / "target" / "meta_target.py", TARGET, mod=mod, name=name,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    try:
        bad = blocking(path)
    finally:
        sys.modules.pop(mod, None)
    hit = bad[(bad.category == "cpu-side-effect") & bad.file.str.endswith(lib.name)
              & (bad.line == marked_line(lib, "# LIBSITE"))]
    assert len(hit) == 1, table(bad)
    assert hit.iloc[0].caller_file.endswith(path.name) and int(hit.iloc[0].caller_line) == site, \
        hit[["caller_file", "caller_line"]].to_string()
