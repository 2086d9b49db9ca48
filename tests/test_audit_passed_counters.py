"""A host counter handed to a callee as a parameter still turns the callee's branch on a later step.

transformers' legacy rotary embedding: `cos, sin = self.rope(x, self.seq_len)` with `prepare()` staging
`self.seq_len`, and in the module `if seq_len > self.max_seq_len_cached: self._set_cache(seq_len)`. The audited
steps all take the same side, but the test turns once the sequence outgrows the cache, and a graph replays the
captured side forever. The callee's test reads only a parameter, so it was not seen as a counter branch. The
parameter is now followed to the traced call's argument. A test that never turns (`seq_len < 0`) stays clean,
and so does a parameter the caller passes a tensor size.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import torch
from torch import nn


class Table(nn.Module):
    def __init__(self):
        super().__init__()
        self.cached = {cap}
        self.register_buffer("rows", torch.randn({cap}, {d}), persistent=False)

    def forward(self, x, n):
        if {test}:  # SITE
            self.rows = torch.randn(n, {d})
            self.cached = n
        return x + self.rows[:{d}].sum(0)


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.table = Table()
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})
        self.n = {start}

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        {stage}

    @torch.no_grad()
    def step(self):
        {advance}
        self.out.copy_(self.table({call}))
        return self.out


def make(device):
    return Target()
"""

CASES = {  # name: (test, stage, advance, call, turns)
    "staged-positional": ("n > self.cached", "self.n = {start} + i", "", "self.x, self.n + 1", True),
    "advanced-keyword": ("n >= self.cached", "", "self.n += 1", "self.x, n=self.n", True),
    "never-turns": ("n < 0", "self.n = {start} + i", "", "self.x, self.n", False),
    "size": ("n > self.cached", "", "", "self.x, self.x.shape[0]", False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_counter_passed_to_a_callee_branch(tmp_path, case):
    test, stage, advance, call, turns = CASES[case]
    start = random.randrange(0, 8)
    path, site = write_target(tmp_path / "passed_target.py", TARGET, test=test, stage=stage.format(start=start),
                              advance=advance, call=call, start=start, cap=random.choice([64, 100, 500]),
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    hit = at(bad, "data-dependent-control", site)
    assert len(hit) == (1 if turns else 0), table(bad)
