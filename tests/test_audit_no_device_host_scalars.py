"""A small tensor made by a factory that names no device (`torch.tensor(0.01)`) in a class that puts its
other tensors on the device it is given is a host tensor on every machine: a device op that takes it is
handed its value at launch, so one that prepare() changes is a baked-host-value (as with `device="cpu"`).
A class that never names a device follows whatever the target runs on: nothing to report."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, table, write_target

TARGET = """
import torch


class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g){place}
        self.x = torch.zeros(1, {d}){place}
        self.out = torch.zeros(1, {d}){place}
        self.scale = torch.tensor({v})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        self.scale.fill_({v} + {dv} * i)

    def step(self):
        y = (self.x @ self.w) * self.scale  # SITE
        self.out.copy_(y)
        return self.out


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("placed", [True, False])
def test_no_device_scalar_beside_device_tensors(tmp_path, placed):
    place = random.choice([".to(device)", ".to(device=device)"]) if placed else ""
    path, site = write_target(tmp_path / "t.py", TARGET, seed=random.randrange(2**31), d=random.choice([4, 8]),
                              place=place, v=round(random.uniform(0.5, 2), 3), dv=round(random.uniform(0.01, 0.1), 3))
    bad = blocking(path)
    hits = bad[(bad.category == "baked-host-value") & (bad.line == site)]
    assert len(hits) == (1 if placed else 0), table(bad)
