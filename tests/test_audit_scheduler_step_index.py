"""data-dependent-control: a diffusers-style scheduler's final-step branch, read through its `step_index` property.

DPMSolverMultistepScheduler keeps its position in `self._step_index`, reads it as `self.step_index` (a property
returning it as it is) and picks the lower-order update on the last step: `lower_order_final = self.step_index ==
len(self.timesteps) - 1`, then `if self.order == 1 or lower_order_final:`. The audited steps are mid-schedule and
all take one side; the test turns at the end and a graph replays the captured side. Two things hid it: the read
went through the property (now read as the attribute its getter returns, `source/property_aliases.py`), and the
comparison sat in the local the test reads, where the unreadable `len(...)` left only the fallback, which looked
for comparisons in the test alone. A test that never turns
(`self.step_index >= 0`) stays clean. Sizes, names and spellings are drawn fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import torch


class Scheduler:
    def __init__(self, n, d):
        self.timesteps = torch.linspace(999, 0, n)
        self.sigmas = torch.linspace(1.0, 0.0, n + 1)
        self.order = 2
        self.{attr} = 0
        self.prev = torch.zeros(1, d)

    @property
    def step_index(self):
        {getter}

    def step(self, out, x):
        {bind}
        if {test}:  # SITE
            y = x + out
        else:
            y = x + 0.5 * (out + self.prev)
        self.prev.copy_(out)
        self.{attr} += 1
        return y


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.lin = torch.nn.Linear({d}, {d})
        self.sched = Scheduler({n}, {d})
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    @torch.no_grad()
    def step(self):
        self.out.copy_(self.sched.step(self.lin(self.x), self.x))
        return self.out


def make(device):
    return Target()
"""

GETTERS = {"plain": '"""The current position."""\n        return self.{attr}', "bare": "return self.{attr}"}
FINAL = {  # name: (bind, test, turns)
    "local": ("last = self.step_index == len(self.timesteps) - 1", "self.order == 1 or last", True),
    "local_and": ("final = (self.step_index == len(self.timesteps) - 1) and self.order > 1", "final", True),
    "direct": ("pass", "self.step_index >= {n} - 1", True),
    "never": ("pass", "self.step_index >= 0", False),
}


@pytest.mark.parametrize("kind", sorted(FINAL))
def test_a_final_step_branch_through_the_property(tmp_path, kind):
    bind, test, turns = FINAL[kind]
    attr = random.choice(["_step_index", "_index", "_pos"])
    getter = random.choice(list(GETTERS.values())).format(attr=attr)
    n, d = random.randint(12, 40), random.choice([4, 8])
    tpl = TARGET.replace("{bind}", bind).replace("{test}", test.replace("{n}", str(n))).replace("{getter}", getter)
    path, site = write_target(tmp_path / "sched.py", tpl, seed=random.randrange(2**31), d=d, n=n, attr=attr)
    bad = blocking(path)
    hits = at(bad, "data-dependent-control", site)
    assert len(hits) == (1 if turns else 0), table(bad)
    assert "step_index" in hits.iloc[0].message or attr in hits.iloc[0].message if turns else True, table(hits)
