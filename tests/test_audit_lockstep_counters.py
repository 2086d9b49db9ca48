"""A branch on two host counters that move together never turns.

GPT-NeoX-style rotary code rebuilds its cos/sin table when `seq_len > self.max_seq_len_cached` and sets the cached
length to `seq_len`; with the sequence length passed down from a decode loop's counter (`self.kv_len`, through an
attention module's forward into the rotary's), every step takes the rebuild side and always will: the cached length
moves with the counter. The hazards there are the table's changing size and the two counters themselves, not a
branch a replay would leave. A test compared against a fixed limit (`seq_len > self.limit`) still turns.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TPL = """
import torch
from torch import nn


class Rotary(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim))
        self.limit = {limit}
        self._build(2)

    def _build(self, n):
        self.max_seq_len_cached = n
        f = torch.outer(torch.arange(n).float(), self.inv_freq)
        self.cos_cached = f.cos()

    def forward(self, x, seq_len):
        if seq_len > self.{bound}:  # SITE
            self._build(seq_len)
        return x * self.cos_cached[-1]


class Attn(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.rot = Rotary(dim)

    def forward(self, x, kv_len):
        return self.rot(x, seq_len=kv_len)


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.attn = Attn({d})
        self.x = torch.randn(1, {d} // 2, generator=g)
        self.kv_len = {start}

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d} // 2))

    @torch.no_grad()
    def step(self):
        y = self.attn(self.x, self.kv_len)
        self.kv_len += 1
        return y


def make(device):
    return Target()
"""


@pytest.mark.parametrize("bound", ["max_seq_len_cached", "limit"])
def test_a_test_on_two_counters_in_lockstep_does_not_turn(tmp_path, bound):
    start = random.randrange(3, 9)
    path, site = write_target(tmp_path / "lockstep_rope.py", TPL, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), start=start, bound=bound,
                              limit=start + random.randrange(20, 200))
    bad = blocking(path)
    hits = at(bad, "data-dependent-control", site)
    if bound == "limit":  # a fixed limit: the counter passes it on a later step
        assert len(hits) == 1, table(bad)
    else:
        assert not len(hits), table(bad)
        assert len(bad[bad.category == "cpu-side-effect"]) == 2, table(bad)
