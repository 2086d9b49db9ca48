"""data-dependent-control: a counter test that also reads its loop's own variable already took both sides.

A hand-written relative-position bias computed on the host, `[bucket(self.pos - j) if j <= self.pos else 0 for j
in range(MAX_LEN)]`, tests the counter against the comprehension's `j`: each audited step runs the test at every
`j` and takes both sides, neither of which runs an op (the list reaches the device through `torch.tensor`, the
baked-host-value there). Read without `j`'s values the test looked like one the counter turns on a later step.
The loop over `range(...)` now gives `j` its values (`branches/loop_values.py`); a test of the counter alone
inside the same loop (`if self.pos < LIMIT`) still turns and stays a finding. Sizes and spellings are fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import torch

N = {n}
LIMIT = {limit}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.emb = torch.nn.Embedding({nb}, 4)
        self.span = {n}
        self.out = torch.zeros({n}, 4)
        self.{pos} = 0

    def prepare(self, i):
        pass

    @torch.no_grad()
    def step(self):
{body}
        idx = torch.tensor(vals).clamp(max={nb} - 1)
        self.out.copy_(self.emb(idx))
        self.{pos} += 1
        return self.out


def make(device):
    return Target()
"""

BODIES = {  # name: (body, turns)
    "comprehension": ("        vals = [self.{pos} - j if j <= self.{pos} else 0 for j in range({bound})]  # SITE", False),
    "statement": ("        vals = []\n        for j in range({bound}):\n            if j <= self.{pos}:  # SITE\n"
                  "                vals.append(self.{pos} - j)\n            else:\n                vals.append(0)", False),
    "start_stop": ("        vals = [1 if self.{pos} >= k else 0 for k in range(0, {bound})]  # SITE", False),
    "counter_only": ("        vals = [j if self.{pos} < LIMIT else 0 for j in range({bound})]  # SITE", True),
}


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_counter_test_over_a_loop_variable(tmp_path, kind):
    body, turns = BODIES[kind]
    n = random.randint(10, 40)
    bound = random.choice(["N", "self.span", str(n)])
    pos = random.choice(["pos", "cur", "t"])
    tpl = TARGET.replace("{body}", body.replace("{bound}", bound))
    path, site = write_target(tmp_path / "buckets.py", tpl, seed=random.randrange(2**31), n=n, nb=n + 1,
                              limit=random.randint(200, 900), pos=pos)
    bad = blocking(path)
    assert len(at(bad, "data-dependent-control", site)) == (1 if turns else 0), table(bad)
