"""A branch on a host counter the step advances (or prepare() sets) turns on some later step: `if self.n % every == 0:` takes the
same side in the few audited steps, so the trace alone sees no divergence and no wait behind it. The scan runs
the test forward on the counter's stride and reports the branch (and the waits of the side not yet taken);
the length of a list the step grows (`len(self.hist)`) is such a counter. A test that never turns (`self.n >= 0`
while n grows), one on a list prepare() empties and the step refills to the same length, and a branch on a flag the step leaves
alone stay clean."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, marked_line, table, write_target

TARGET = """
import torch

STEPS = {start}

class Logger:
    total = 0

    def __init__(self):
        self.n = {start}
        self.t = {start}
        self.every = {every}
        self.limit = {limit}
        self.debug = False
        self.hist = []
        self.seen = []
        self.w = torch.randn({d}, {d}) * 0.1
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        self.t = {start} + i
        self.seen = []

    def step(self):
        global STEPS
        y = torch.tanh(self.x @ self.w)
        self.n += 1
        STEPS += 1
        Logger.total += 1
        n = self.n
        self.hist.append(n)
        self.seen.extend([n] * 3)
        {branch}
        self.out.copy_(y)
        return self.out

def make(device):
    return Logger()
"""

TURNING = {
    "modulo-attribute": "if self.n % self.every == 0:  # SITE\n            print(float(y.norm().item()))  # WAIT",
    "modulo-global": "if STEPS % {every} == 0:  # SITE\n            print(y.sum().item())  # WAIT",
    "bound-local": "if n % {every} == 1:  # SITE\n            print(y.tolist())  # WAIT",
    "limit-raise": "if self.n >= self.limit:  # SITE\n            raise RuntimeError('cache full')",
    "class-counter": "if self.total % self.every == self.every - 1:  # SITE\n            print(y.tolist())  # WAIT",
    "staged-index": "if self.t % self.every == 0:  # SITE\n            print(y.sum().item())  # WAIT",
    "conditional-expression": "y = y * 0.5 if (n - 1) % self.every == 0 else y  # SITE",
    "list-length": "if len(self.hist) >= self.limit // 100:  # SITE\n            print(y.sum().item())  # WAIT",
}
SETTLED = {
    "never-turns": "if self.n >= 0:  # SITE\n            y = y * 2",
    "unchanged-flag": "if self.debug:  # SITE\n            print(y.sum().item())",
    "length-never-turns": "if len(self.hist) > 0:  # SITE\n            y = y * 2",
    "refilled-length": "if len(self.seen) >= {every}:  # SITE\n            print(y.sum().item())",
}


def _write(tmp_path, branch: str):
    every = random.randrange(50, 500)
    fields = dict(start=random.randrange(0, 10) * every + 2, every=every, limit=random.randrange(10_000, 90_000),
                  d=random.choice([4, 8, 16]))
    return write_target(tmp_path / "logger_target.py", TARGET, branch=branch.format(**fields), **fields)


@pytest.mark.parametrize("form", sorted(TURNING))
def test_a_branch_the_counter_turns_later_is_reported(tmp_path, form):
    path, site = _write(tmp_path, TURNING[form])
    bad = blocking(path)
    hit = at(bad, "data-dependent-control", site)
    assert len(hit) == 1, table(bad)
    assert ("between the steps" if form == "staged-index" else "advances") in hit.iloc[0].message
    if "raise" in TURNING[form]:
        assert "raises" in hit.iloc[0].message
    elif "# WAIT" in TURNING[form]:  # the wait in the side no audited step took
        assert len(at(bad, "host-sync", marked_line(path, "# WAIT"))) == 1, table(bad)


@pytest.mark.parametrize("form", sorted(SETTLED))
def test_a_branch_that_cannot_turn_is_left_alone(tmp_path, form):
    path, site = _write(tmp_path, SETTLED[form])
    bad = blocking(path)
    assert at(bad, "data-dependent-control", site).empty, table(bad)
    assert at(bad, "host-sync", site + 1).empty, table(bad)


def test_a_branch_the_audited_steps_took_both_ways_is_reported_once(tmp_path):
    path, site = _write(tmp_path, "if self.n % 2 == 0:  # SITE\n            y = y + y.sum()")
    bad = blocking(path)
    assert len(at(bad, "data-dependent-control", site)) == 1, table(bad)
