"""cpu-side-effect: a library object drawing from a host generator it keeps behind a property, in a method that
runs no torch op (gymnasium's `Space.sample()`: `self.np_random.integers(n)`, `np_random` returning
`self._np_random`). The site is the drawing statement that ran, with the target's call as caller: not the
statements that assign the attribute (a `seed()` or `__setstate__`'s `self.__dict__.update(state)`, which never ran),
nor the draws on the branches the call did not take. Drawing in prepare() is fine.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, module_target, table, write_target

LIB = """
import numpy as np


class Space:
    def __init__(self, n, seed=None):
        self.n = n
        self._rng = None
        if seed is not None:
            self.seed(seed)

    @property
    def {prop}(self):
        if self._rng is None:
            self.seed()
        return self._rng

    def seed(self, seed=None):
        self._rng = np.random.default_rng(seed)

    def __setstate__(self, state):
        self.__dict__.update(state)

    def sample(self, mask=None, probability=None):
        if mask is not None:
            return self.{prop}.choice(np.flatnonzero(mask))
        elif probability is not None:
            return self.{prop}.choice(self.n, p=probability)
        return int(self.{prop}.{draw})  # LIBSITE
"""

DRAWS = ["integers(self.n)", "random() * self.n", "integers(0, self.n)"]


@pytest.mark.parametrize("in_step", [True, False])
def test_a_draw_through_a_property_is_sited_at_the_statement_that_ran(tmp_path, monkeypatch, in_step):
    prop = random.choice(["np_random", "rng", "generator"])
    src = LIB.format(prop=prop, draw=random.choice(DRAWS))
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="spaces")
    n = random.choice([3, 5, 7])
    call = "self.a = self.space.sample()"
    tpl = module_target(imports=f"from {mod} import Space",
                        init=f"        self.space = Space({n}, seed={random.randrange(1000)})\n        self.a = 0",
                        prepare=f"        {call}" if not in_step else "",
                        step=(f"        {call}  # SITE\n" if in_step else "        pass  # SITE\n") +
                        "        self.out.copy_(self.x * 2.0)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "explore.py", tpl, seed=random.randrange(2**31), d=4)
    bad = blocking(path, forget=mod)
    cse = bad[(bad.category == "cpu-side-effect") & bad.file.str.endswith(".py") & bad.file.str.contains("spaces_")]
    if not in_step:
        assert not len(cse), table(bad)
        return
    assert list(cse.line) == [marked_line(lib, "# LIBSITE")], table(bad)
    assert int(cse.iloc[0].caller_line) == site, table(cse)
    assert "_rng" in cse.iloc[0].message, table(cse)
