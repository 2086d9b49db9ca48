"""stale-input-pointer: a generate loop's window into its token buffer, sliced at the new position each step.

A released-style generate loop keeps every token in one `tokens` buffer and feeds the model
`tokens[:, prev:cur]`, a view at a new offset each step: a graph would read the token at the offset it
captured forever. The step then routes the token on the host (a bincount read back, an expert run only when
picked), so consecutive steps part after the embedding reads the view. The rule compared addresses only
where two steps made exactly the same calls, and so lost the moving window in any step whose routing
differed; the calls before the steps part are the same call all the same. A static buffer refilled with
copy_ (the clean twin) reads one address. Sizes, expert count and tokens are drawn fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch
from torch import nn


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.emb = nn.Embedding({vocab}, {d})
        self.experts = nn.ModuleList(nn.Linear({d}, {d}) for _ in range({n}))
        # token k routes to expert k % {n}: consecutive steps always run different experts
        self.tokens = torch.randint(0, {vocab} // {n}, (1, 64)) * {n} + torch.arange(64) % {n}
        self.buf = torch.zeros(1, 1, dtype=torch.long)
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        {stage}

    @torch.no_grad()
    def step(self):
        x = self.emb(self.ids)[:, 0]  # SITE
        counts = torch.bincount(self.ids.flatten() % {n}, minlength={n}).tolist()
        for e in range({n}):
            if counts[e]:
                x = self.experts[e](x)
        self.out.copy_(x)
        return self.out


def make(device):
    return Target()
"""


@pytest.mark.parametrize("kind", ["window", "static"])
def test_token_window_moves(tmp_path, kind):
    stage = ("self.ids = self.tokens[:, i:i + 1]" if kind == "window"
             else "self.buf.copy_(self.tokens[:, i:i + 1])\n        self.ids = self.buf")
    path, site = write_target(tmp_path / "window.py", TEMPLATE, seed=random.randrange(2**31), stage=stage,
                              vocab=random.choice([64, 128]), d=random.choice([4, 8, 16]), n=random.choice([2, 3, 4]))
    bad = blocking(path)
    hit = at(bad, "stale-input-pointer", site)
    if kind == "static":
        assert not len(bad[bad.category == "stale-input-pointer"]), table(bad)
    else:
        assert len(hit) == 1 and "address of one buffer" in hit.iloc[0].message, table(bad)
