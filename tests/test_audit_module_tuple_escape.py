"""A module attribute rebound to a tuple of tensors the step made and the next step reads is the escape
(step-allocation), not a cpu-side-effect as well.

x-transformers-style attention keeps `self.cache = (k, v)` grown with `torch.cat` on the module itself.
nn.Module's `__setattr__` leaves a setattr record, and the side-effect rule reported that store before
asking whether every tensor the tuple newly holds is an escaped allocation, as it does for a plain
object's attribute: the same store was reported twice, once in a category whose fix (move the counter to
the device) does not apply.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, table, write_target

TARGET = """
import torch
from torch import nn

D = {d}


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D, 2 * D)
        self.cache = None
        self.count = 0

    def forward(self, x):
        k, v = self.proj(x).chunk(2, dim=-1)
        ck, cv = self.cache
        {store}  # SITE
        {extra}
        return (torch.softmax(x @ k.T, -1) @ v).sum(0, keepdim=True)


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.attn = Attention()
        self.attn.cache = (torch.randn({n}, D), torch.randn({n}, D))
        self.x = torch.zeros(1, D)
        self.out = torch.zeros(1, D)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, D))

    @torch.no_grad()
    def step(self):
        self.out.copy_(self.attn(self.x))
        return self.out


def make(device):
    return Target()
"""

STORES = {
    "chained": "self.cache = (k, v) = (torch.cat((ck, k)), torch.cat((cv, v)))",
    "tuple": "k, v = torch.cat((ck, k)), torch.cat((cv, v)); self.cache = (k, v)",
    "counted": "k, v = torch.cat((ck, k)), torch.cat((cv, v)); self.cache = (k, v); self.count += 1",
}


@pytest.mark.parametrize("kind", ["chained", "tuple", "counted"])
def test_a_module_tuple_of_escaped_tensors_is_the_escape_alone(tmp_path, kind):
    path, site = write_target(tmp_path / "tuple_cache.py", TARGET, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), n=random.randrange(2, 6), store=STORES[kind], extra="")
    bad = blocking(path)
    assert len(bad[(bad.category == "step-allocation") & (bad.line == site)]) >= 1, table(bad)
    side = bad[bad.category == "cpu-side-effect"]
    if kind == "counted":  # the counter beside the tuple is still a change of its own
        assert len(side) == 1 and "count" in side.iloc[0].message, table(bad)
        return
    assert not len(side), table(bad)
