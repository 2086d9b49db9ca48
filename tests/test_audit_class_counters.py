"""cpu-side-effect on a class a step instantiates and drops.

A library processor whose metaclass counts instances on the class (`cls.instances = ... + 1` in the
metaclass's `__call__`) changes Python state at every `MinP(0.05)` in the step, though no object of the
target holds the instance: the classes the state modules define are snapshotted too. The site is the
metaclass's statement, the caller the target's line that instantiates the class (not the line that
calls the instance, whose class's own `__call__` shares the name and file)."""

from __future__ import annotations

import random
import textwrap

from site_util import blocking, install_library, library_hit, module_target, write_target

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

TARGET = module_target(imports="from {mod} import {name}", init="        self.w = torch.randn({d}, {d})", step="""\
        proc = {name}(2.0)  # SITE
        self.out.copy_(proc(self.x @ self.w))
        return self.out""")


def test_a_metaclass_counter_is_found_with_the_instantiating_line_as_caller(tmp_path, monkeypatch):
    tag = random.randrange(10**9)
    mod, name, attr = f"proc_lib_{tag}", f"Clip{tag}", random.choice(["instances", "made", "n_built"])
    _, lib = install_library(tmp_path, monkeypatch, textwrap.dedent(LIB).format(name=name, attr=attr), name=mod)
    path, site = write_target(tmp_path / "target" / "meta_target.py", TARGET, mod=mod, name=name,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    library_hit(bad, "cpu-side-effect", lib, path, site)


SAME_NAME = """
import torch


class Sampler:
    {attr} = 0

    def __init__(self):
        self.w = torch.randn({d}, {d})
        self.x = torch.randn(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.normal_()

    def step(self):
        Sampler.{attr} += 1  # SITE
        self.out.copy_(torch.tanh(self.x @ self.w))
        return self.out


def make(device):
    return Sampler()
"""


def test_a_class_counter_is_found_after_another_target_had_a_class_of_the_same_name(tmp_path):
    """Two files each defining `Sampler` (or a rescan of an edited target in one process): the class of the
    target's object is the one snapshotted, not the other module's class of the same qualified name."""
    attr = random.choice(["calls", "hits", "served"])
    for i in range(2):
        (tmp_path / str(i)).mkdir()
        path, site = write_target(tmp_path / str(i) / f"sampler_{random.randrange(10**9)}.py", SAME_NAME,
                                  attr=attr, d=random.choice([4, 8]))
        bad = blocking(path)
        hit = bad[(bad.category == "cpu-side-effect") & (bad.line == site)]
        assert len(hit) == 1, (i, bad[["category", "line", "message"]].to_string())
