"""An expert loop over data-picked ids: one decision, at the loop, not at an expert's first line.

`for e in active.tolist(): out += self.experts[e](x)` runs a different set of experts each step. Where
one step ran an expert the other did not and both went on with the next expert, the alignment shows
extra ops with no branch around them inside the expert's forward. The choice is the caller's loop (as
when both steps ran the same lines on different experts), so the rule reports the loop once and never
the expert's first line.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, marked_line, table, write_target

TARGET = """
import torch
from torch import nn

E, D = 6, {d}


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D, 2 * D)
        self.down = nn.Linear(2 * D, D)

    def forward(self, x):
        h = torch.relu(self.up(x))  # EXPERT
        return self.down(h)


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.experts = nn.ModuleList(Expert() for _ in range(E))
        self.x = torch.zeros(4, D)
        self.route = torch.zeros(4, dtype=torch.long)
        self.out = torch.zeros(4, D)
        self.sets = {sets}

    def prepare(self, i):
        self.x.copy_(torch.randn(4, D))
        picked = self.sets[i % len(self.sets)]
        self.route.copy_(torch.tensor([picked[j % len(picked)] for j in range(4)]))

    @torch.no_grad()
    def step(self):
        out = torch.zeros_like(self.x)
        active = torch.unique(self.route)
        for e in active.tolist():  # LOOP
            {body}
        self.out.copy_(out)


def make(device):
    return Target()
"""

BODIES = {
    "inline": "hit = (self.route == e)[:, None]\n            out += self.experts[e](self.x) * hit",
    "picked": "hit = (self.route == e)[:, None]\n            expert = self.experts[e]\n            out += expert(self.x) * hit",
}

SETS = [
    [[1, 2], [2], [0, 2], [2, 3]],  # one expert more, then the same expert goes on
    [[1, 2, 4], [2, 4], [3, 4], [1, 2, 4]],
    [[0, 3, 5], [1, 3, 5], [0, 2, 5], [1, 2, 4]],
    [[1, 2, 3, 5], [0, 2, 4, 5], [1, 3, 4, 5], [0, 1, 2, 3]],
]


@pytest.mark.parametrize("body", sorted(BODIES))
@pytest.mark.parametrize("sets", SETS)
def test_a_data_picked_expert_loop_is_one_decision(tmp_path, body, sets):
    path, loop = write_target(tmp_path / "moe_active.py", TARGET, marker="# LOOP", body=BODIES[body],
                              sets=repr(sets), d=random.choice([4, 8]), seed=random.randrange(2**31))
    bad = blocking(path)
    control = bad[bad.category == "data-dependent-control"]
    assert set(control.line) == {loop}, table(bad)
    assert marked_line(path, "# EXPERT") not in set(bad.line), table(bad)
