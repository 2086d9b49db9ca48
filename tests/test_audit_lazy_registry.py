"""A library module-level mapping that loads its values lazily does not stop the scan.

A model registry (`MODEL_MAPPING`, a dict subclass whose `items()` and `__len__` import each class on first
access) sits among the globals of a library module whose code the step ran. Snapshotting that module's state
called its `items()`, which raised for an optional class that is not installed, and the scan stopped with
"step() raised", blaming the target. A snapshot reads a dict by what it stores, never through methods a
subclass overrides; the module's other globals are still state (a call counter bumped in the step is found).
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, module_target, write_target

LIB = """
import collections

import torch


class LazyMapping(collections.OrderedDict):
    def __init__(self, names):
        super().__init__()
        self._names = list(names)

    def __len__(self):
        return len(self._names)

    def _load(self, name):
        raise ValueError(f"could not find {{name}} in this installation")

    def items(self):
        return [(k, self._load(k)) for k in self._names]

    def values(self):
        return [v for _, v in self.items()]


MAPPING = LazyMapping({names!r})
STATS = {{"calls": 0}}


def project(x, w):
    {count}
    return torch.tanh(x @ w)
"""

TARGET = module_target(imports="import {mod} as lib", init="        self.w = torch.randn({d}, {d})", step="""\
        self.out.copy_(lib.project(self.x, self.w))  # SITE
        return self.out""")


@pytest.mark.parametrize("kind", ["clean", "counter"])
def test_a_lazy_mapping_global_is_read_without_running_it(tmp_path, monkeypatch, kind):
    names = [f"Model{random.randrange(10**6)}" for _ in range(random.randint(1, 4))]
    count = 'STATS["calls"] += 1  # LIBSITE' if kind == "counter" else "pass  # LIBSITE"
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(names=names, count=count), prefix="registry")
    path, site = write_target(tmp_path / "target" / "lazy_target.py", TARGET, mod=mod,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "cpu-side-effect", lib, path, site)
