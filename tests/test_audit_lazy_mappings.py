"""A library's lazy mapping, snapshotted without running its code.

transformers keeps its auto-class registries in an `OrderedDict` subclass whose `items()` imports one
model module per key, and raises when one of them cannot be found. The state snapshot fingerprints a
library module's globals; it used to call that `items()` between audited steps, so the scan died with
the library's error blamed on the step (and imported half the library while tracing). A container is
now read from the storage the builtin keeps; what the step really writes there is still a change."""

from __future__ import annotations

import random

import pytest
from site_util import blocking, library_hit, library_target, table

LIB = """
from collections import OrderedDict

import torch


class LazyMapping(OrderedDict):
    calls = 0

    def items(self):  # an auto-class registry: one import per key, and one of them is missing
        type(self).calls += 1
        raise ValueError("Could not find {missing} in the package")

    def __iter__(self):
        type(self).calls += 1
        raise ValueError("Could not find {missing} in the package")

    values = keys = items


REGISTRY = LazyMapping()
REGISTRY["{key}"] = {n}


def helper(x):
    {write}
    y = torch.tanh(x) * {scale}
    return y, float(y.sum())  # LIBSITE
"""


@pytest.mark.parametrize("kind", ["reads", "writes"])
def test_a_lazy_library_mapping_is_fingerprinted_from_its_storage(tmp_path, monkeypatch, kind):
    key, n = f"k{random.randrange(10**6)}", random.randrange(1, 99)
    write = f'REGISTRY["{key}"] += 1  # WRITE' if kind == "writes" \
        else "pass"
    src = LIB.format(missing=f"Model{random.randrange(10**6)}", key=key, n=n, write=write,
                     scale=round(random.uniform(0.5, 2), 3))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "lazymap", "helper", "helper(self.x @ self.w)",
                                          out="y[0]")
    import sys

    bad = blocking(path)  # used to raise TargetFailed: ValueError from LazyMapping.items
    try:
        assert sys.modules[mod].LazyMapping.calls == 0  # the scan ran none of the mapping's own code
    finally:
        sys.modules.pop(mod, None)
    library_hit(bad, "host-sync", lib, path, site)
    side = bad[bad.category == "cpu-side-effect"]
    if kind == "reads":
        assert not len(side), table(bad)
    else:
        write_line = next(i for i, t in enumerate(lib.read_text().splitlines(), 1) if "# WRITE" in t)
        assert list(side.line) == [write_line] and f"REGISTRY[{key!r}]" in side.iloc[0].message, table(bad)
