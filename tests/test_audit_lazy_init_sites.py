"""A lazily created object the step advances is reported at the statement that advances it, not at its setup.

`if self.noise_iter is None: self.noise_iter = iter(range(...))` runs once (in warmup); every later step only
calls `next(self.noise_iter)`. Both statements write the attribute as far as the source goes, and both were
named. When the attribute held a value before the step, a statement under `if <x>.attr is None` did not run.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_hit, library_target, table

LIB = """
import itertools


def _counter():
    n = 0
    while True:
        n += 1
        yield n


class Noise:
    def __init__(self):
        self.{attr} = None
        self.other = 0

    def draw(self, x):
        if {test}:
            self.{attr} = {make}
        k = next(self.{attr})  # LIBSITE
        return x * (1.0 + 0.0 * k)
"""

MAKES = ["iter(range(10 ** 9))", "itertools.count()", "_counter()"]
TESTS = ["self.{attr} is None", "self.{attr} is None or self.other < 0"]


@pytest.mark.parametrize("make", MAKES)
def test_the_advance_not_the_lazy_setup(tmp_path, monkeypatch, make):
    attr = random.choice(["noise_iter", "_it", "counter"])
    src = LIB.replace("{test}", random.choice(TESTS)).replace("{make}", make).replace("{attr}", attr)
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "lazy_lib", "Noise",
                                          "self.nz.draw(self.x @ self.w)", init="        self.nz = Noise()")
    bad = blocking(path, forget=mod)
    library_hit(bad, "cpu-side-effect", lib, path, site)
    assert len(bad[bad.category == "cpu-side-effect"]) == 1, table(bad)
