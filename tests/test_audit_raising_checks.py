"""A bounds check on a host counter spelled without an `if` turns on a later step, as `if ...: raise` does.

`assert self.n < self.limit` and torch's compile-era `torch._check(self.n < self.limit, lambda: ...)` (or
`_check_with(IndexError, cond, msg)`) hold in the few audited steps and fail once the counter passes the limit; a
graph never runs them, so a replay writes past the cache instead of raising. Only the `if` form was read. A check
that never turns (`self.n >= 0`) and one on a fixed size (`x.shape[-1] == d`) stay clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import torch


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})
        self.n = {start}
        self.limit = {limit}

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        y = torch.tanh(self.x @ self.w)
        self.n += 1
        {check}  # SITE
        self.out.copy_(y)
        return self.out


def make(device):
    return Target()
"""

CHECKS = {  # name: (statement, turns)
    "assert": ("assert self.n < self.limit, 'cache full'", True),
    "torch-check": ("torch._check(self.n < self.limit, lambda: f'cache full at {{self.n}}')", True),
    "check-with": ("torch._check_with(IndexError, self.n <= self.limit, lambda: 'full')", True),
    "never-turns": ("torch._check(self.n >= 0)", False),
    "fixed-size": ("torch._check(y.shape[-1] == self.w.shape[0])", False),
}


@pytest.mark.parametrize("kind", sorted(CHECKS))
def test_a_raising_check_on_a_counter(tmp_path, kind):
    check, turns = CHECKS[kind]
    path, site = write_target(tmp_path / "check_target.py", TARGET, check=check, start=random.randrange(0, 10),
                              limit=random.choice([100, 512, 4000]), seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    bad = blocking(path)
    assert len(at(bad, "data-dependent-control", site)) == (1 if turns else 0), table(bad)
    assert not len(bad[(bad.category != "cpu-side-effect") & (bad.line != site)]), table(bad)
