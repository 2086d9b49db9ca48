"""A counter branch whose sides run no op: host bookkeeping on a block boundary (`if self.n % BS == 0:
self.table.append(self.free.pop())`, a paged KV cache's free list kept in Python). The audited steps walk both
sides and launch the same kernels either way, so the branch is no data-dependent-control: what it changes is
Python state (cpu-side-effect, at the append). Its test reads a module constant (`BS`), whose value the
forward run of the test needs: a test on a constant that can no longer turn (`if self.n < CALIB:` long after
calibration) is left alone, one that turns later (`if self.n >= LIMIT: raise`) is still reported."""

from __future__ import annotations

import random

from site_util import at, blocking, table, write_target

TARGET = """
import torch

BS = {bs}
CALIB = {calib}
LIMIT = {limit}

class Paged:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.pool = torch.zeros(64, {bs}, {d})
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})
        self.free = list(range(64))
        self.table = []
        self.n = {start}
        self.amax = 1.0

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        y = torch.tanh(self.x @ self.w)
        n = self.n
        {branch}
        self.n += 1
        self.out.copy_(y + self.pool[0, 0])
        return self.out

def make(device):
    return Paged()
"""

BOOKKEEPING = "if n % BS == 0:  # SITE\n            self.table.append(self.free.pop())  # APPEND"
SETTLED = "if self.n < CALIB:  # SITE\n            self.amax = max(self.amax, 2.0)"
TURNING = "if self.n >= LIMIT:  # SITE\n            raise RuntimeError('out of blocks')"


def _write(tmp_path, branch):
    calib = random.randrange(5, 50)
    fields = dict(bs=random.choice([2, 3, 4]), calib=calib, limit=random.randrange(1000, 9000),
                  start=calib + random.randrange(1, 20), seed=random.randrange(1000), d=random.choice([4, 8, 16]))
    return write_target(tmp_path / "paged_target.py", TARGET, branch=branch, **fields)


def test_a_branch_that_only_keeps_host_books_is_state_not_control(tmp_path):
    path, site = _write(tmp_path, BOOKKEEPING)
    bad = blocking(path)
    assert at(bad, "data-dependent-control", site).empty, table(bad)
    assert len(at(bad, "cpu-side-effect", site + 1)) == 1, table(bad)


def test_a_test_on_a_module_constant_that_can_no_longer_turn_is_left_alone(tmp_path):
    path, site = _write(tmp_path, SETTLED)
    bad = blocking(path)
    assert at(bad, "data-dependent-control", site).empty, table(bad)


def test_a_test_on_a_module_constant_that_turns_later_is_reported(tmp_path):
    path, site = _write(tmp_path, TURNING)
    bad = blocking(path)
    hit = at(bad, "data-dependent-control", site)
    assert len(hit) == 1 and "raises" in hit.iloc[0].message, table(bad)
