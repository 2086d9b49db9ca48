"""A host counter the step advances is reported at the statement the step runs, not also at a method the
sampling loop calls between steps that writes the same attribute.

A scheduler keeps a Python `_step_index`: the loop sets it through `set_step(i)` (or `set_timesteps`), the
step moves it on through `_advance()`. The change runs no torch op and goes through no `__setattr__` hook,
so its line is read from source, and both writers were named: one finding sat on a line the step never ran.
Only writers the step's code reaches by name are kept (directly, through a helper, or through a property).
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_hit, library_target, table

LIB = """
import torch


class Scheduler:
    def __init__(self, n):
        self.sigmas = torch.linspace(1.0, 0.1, n + 1)
        self.n = n
        self._step_index = 0

    def {setter}(self, i):
        self._step_index = i % self.n

    def _advance(self):
        {advance}

    def _bump(self):
        self._advance()

    @property
    def moved(self):
        self._advance()
        return self

    def step(self, x):
        y = x * self.sigmas[0]
        {how}
        return y
"""

ADVANCE = ["self._step_index = (self._step_index + 1) % self.n  # LIBSITE",
           "self._step_index += 1  # LIBSITE"]
HOW = {"direct": "self._advance()", "helper": "self._bump()", "property": "_ = self.moved"}


@pytest.mark.parametrize("how", sorted(HOW))
@pytest.mark.parametrize("loop_sets", [False, True])
def test_only_the_writer_the_step_reaches(tmp_path, monkeypatch, how, loop_sets):
    setter = random.choice(["set_step", "set_timesteps", "set_begin_index"])
    src = LIB.format(setter=setter, advance=random.choice(ADVANCE), how=HOW[how])
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "sched_lib", "Scheduler",
                                          "self.s.step(self.x @ self.w)", init="        self.s = Scheduler(64)",
                                          prepare=f"        self.s.{setter}(i)" if loop_sets else "")
    bad = blocking(path, forget=mod)
    library_hit(bad, "cpu-side-effect", lib, path, site)
    side = bad[bad.category == "cpu-side-effect"]
    assert len(side) == 1, table(bad)
