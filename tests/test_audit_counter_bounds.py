"""dynamic-shape at a top-k whose count is read off a host position, in step with the scores it ranks.

A sparse-attention indexer scores the part of its compressed cache written so far (`self.cache[:end // r]`,
`end = pos + n` with `pos` a Python position handed down from the model) and keeps
`scores.topk(min(self.k, end // r))`. The count grows with the scores' width step by step, yet it is no size
read: scoring the whole cache (the slice's fix) leaves the count growing. So the top-k is an origin of its own.
A top-k whose count is read off the scores (`min(self.k, s.size(-1))`) only follows the slice and is not.
"""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

TEMPLATE = """
import torch
from torch import nn


class Indexer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear({d}, {d})
        self.k = {k}
        self.register_buffer("cache", torch.randn({cap}, {d}))

    def forward(self, x, start_pos):
        n = x.size(0)
        end = start_pos + n
        s = self.cache[: end // {ratio}] @ self.q(x).T
        idx = s.T.topk({count}, dim=-1)[1]  # SITE
        return idx


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.indexer = Indexer()

    def forward(self, x, pos):
        return self.indexer(x, pos)


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.net = Net()
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {k}, dtype=torch.long)

    def prepare(self, i):
        self.pos = {prompt} + i
        self.x.copy_(torch.randn(1, {d}))

    @torch.no_grad()
    def step(self):
        idx = self.net(self.x, self.pos)
        return idx.sum()


def make(device):
    return Target()
"""


def _fields(count):
    # ratio 1..2 so the scored width grows within the audited steps, and k above it so the count grows too
    ratio = random.choice([1, 2])
    return dict(seed=random.randrange(10**6), d=random.choice([8, 16]), k=64, cap=64, ratio=ratio,
                prompt=random.choice([4, 6, 9]), count=count.replace("RATIO", str(ratio)))


def test_a_count_read_off_the_position_is_an_origin(tmp_path):
    path, site = write_target(tmp_path / "counter_topk.py", TEMPLATE, **_fields("min(self.k, end // RATIO)"))
    bad = blocking(path)
    assert ((bad.line == site) & (bad.category == "dynamic-shape")).any(), table(bad)


def test_a_count_read_off_the_scores_follows_them(tmp_path):
    path, site = write_target(tmp_path / "counter_topk_follow.py", TEMPLATE, **_fields("min(self.k, s.size(0))"))
    bad = blocking(path)
    assert (bad.category == "dynamic-shape").any(), table(bad)  # the slice
    assert not (bad.line == site).any(), table(bad)
