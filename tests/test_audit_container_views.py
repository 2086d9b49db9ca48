"""A container slot rebound in the step to a view of a persistent pool (a cache manager handing each layer
its rows: `self.layer_states[i] = self.pool[i]`) changes no Python state a replay would miss when the new
view reads the same memory the same way as the one it replaces: same storage, offset, shape and strides.
Rebinding the slot to other rows (`self.pool[(i + self.flip) % n]`, alternating) is a change.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, table, write_target

SAME = {
    "list": "self.slots[i] = self.pool[i]",
    "dict": "self.slots[i] = self.pool.narrow(0, i, 1)[0]",
}
OTHER = "self.slots[i] = self.pool[(i + self.flip) % {n}]"

TARGET = """
import torch

class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g).to(device) * 0.1
        self.pool = torch.zeros({n}, {d}, device=device)
        self.slots = {container}
        self.flip = 0
        self.x = torch.zeros({d}, device=device)
        self.out = torch.zeros({d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn({d}))
        self.flip = i % 2

    def step(self):
        h = self.x
        for i in range({n}):
            {line}  # SITE
            self.slots[i].mul_(0.5).add_(torch.tanh(h @ self.w))
            h = h + self.slots[i]
        self.out.copy_(h)
        return self.out

def make(device):
    return Target(device)
"""


def _write(tmp_path, container: str, line: str):
    n, d = random.choice([2, 4]), random.choice([4, 8])
    made = "[self.pool[i] for i in range({n})]" if container == "list" else "{{i: self.pool[i] for i in range({n})}}"
    return write_target(tmp_path / "views_target.py", TARGET, seed=random.randrange(2**31), n=n, d=d,
                        container=made.format(n=n), line=line.format(n=n))


@pytest.mark.parametrize("container", sorted(SAME))
def test_a_slot_rebound_to_the_same_view_is_no_side_effect(tmp_path, container):
    path, _ = _write(tmp_path, container, SAME[container])
    bad = blocking(path)
    assert not len(bad[bad.category == "cpu-side-effect"]), table(bad)


@pytest.mark.parametrize("container", sorted(SAME))
def test_a_slot_rebound_to_other_rows_is(tmp_path, container):
    path, site = _write(tmp_path, container, OTHER)
    bad = blocking(path)
    assert len(bad[(bad.category == "cpu-side-effect") & (bad.line == site)]) == 1, table(bad)
