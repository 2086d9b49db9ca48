"""baked-host-value / dynamic-shape messages: a bound that moves once in the audited steps shows its move.

A compressed cache's length grows once every `ratio` positions (`torch.arange((pos + 1) // ratio)`), so
over a scan of six steps it may hold one value for five steps and change at the last. The message listed
the first four values, `1 -> 1 -> 1 -> 1 -> ...`, as if nothing changed; it names the run and shows the
change: `1 (5 steps) -> 2`. Values that move at once keep the plain step-by-step list. Values drawn fresh."""

from __future__ import annotations

import random

import pytest

import audit
from site_util import at, table, write_target

TEMPLATE = """
import torch


class Target:
    def __init__(self):
        self.x = torch.zeros(1, 16)
        self.out = torch.zeros(1)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, 16))
        self.n = {lo} if i < {last} else {hi}

    def step(self):
        y = self.x[:, :self.n]  # SITE
        self.out.copy_(y.sum(1))
        return self.out


def make(device):
    return Target()
"""


@pytest.mark.parametrize("late", [True, False])
def test_run_then_change(tmp_path, late):
    lo = random.randint(1, 7)
    hi = lo + random.randint(1, 7)
    steps = 6
    last = 2 + steps - 1 if late else 2 + 1  # warmup 2: the audited steps are i = 2 .. 2 + steps - 1
    path, site = write_target(tmp_path / "late.py", TEMPLATE, lo=lo, hi=hi, last=last)
    bad = audit.scan(f"{path}:make", device="cpu", steps=steps).blocking()
    baked, shape = at(bad, "baked-host-value", site), at(bad, "dynamic-shape", site)
    assert len(baked) == 1 and len(shape) == 1, table(bad)
    if late:
        assert f"{lo} ({steps - 1} steps) -> {hi}" in baked.iloc[0].message, table(bad)
        assert f"[1, {lo}] ({steps - 1} steps) -> [1, {hi}]" in shape.iloc[0].message, table(bad)
    else:
        assert f"{lo} -> {hi} -> {hi} -> {hi} -> ..." in baked.iloc[0].message, table(bad)
