"""data-dependent-control at an early exit that follows another host-decided block in the same call.

A compressor that emits one pooled row every `ratio` positions writes the new row into its window, pools the
window under `if emit:`, and returns early under `if not emit:` before normalising and storing the pooled row.
On the emitting step both blocks run back to back: the two steps differ in one region, yet two branches decided
it, and removing the first leaves the early return deciding the rest. Both are reported. A twin that pools every
step and selects the stored row on the device has no data-dependent-control.
"""

from __future__ import annotations

import random

from site_util import blocking, marked_line, table, write_target

HAZARD = """
import torch
from torch import nn


class Compressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear({d}, {d})
        self.norm = nn.LayerNorm({d})
        self.register_buffer("window", torch.zeros({ratio}, {d}))
        self.register_buffer("pooled", torch.zeros({cap}, {d}))

    def forward(self, x, pos):
        h = self.proj(x)
        self.window[pos % {ratio}] = h
        emit = (pos + 1) % {ratio} == 0
        if emit:  # FIRST
            row = self.window.softmax(0).mul(self.window).sum(0)
        if not emit:  # SITE
            return None
        row = self.norm(row) * 2.0
        self.pooled[pos // {ratio}] = row
        return row


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.comp = Compressor()
        self.x = torch.zeros({d})

    def prepare(self, i):
        self.pos = {prompt} + i
        self.x.copy_(torch.randn({d}))

    @torch.no_grad()
    def step(self):
        self.comp(self.x, self.pos)
        return self.comp.pooled


def make(device):
    return Target()
"""

CLEAN = """
import torch
from torch import nn


class Compressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear({d}, {d})
        self.norm = nn.LayerNorm({d})
        self.register_buffer("window", torch.zeros({ratio}, {d}))
        self.register_buffer("pooled", torch.zeros({cap}, {d}))

    def forward(self, x, pos):
        h = self.proj(x)
        self.window.index_copy_(0, pos % {ratio}, h[None])
        emit = (pos + 1) % {ratio} == 0
        row = self.window.softmax(0).mul(self.window).sum(0)
        row = self.norm(row) * 2.0  # SITE
        slot = pos // {ratio}
        self.pooled.index_copy_(0, slot, torch.where(emit, row[None], self.pooled.index_select(0, slot)))
        return row


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.comp = Compressor()
        self.x = torch.zeros({d})
        self.pos = torch.zeros(1, dtype=torch.long)

    def prepare(self, i):
        self.pos.fill_({prompt} + i)
        self.x.copy_(torch.randn({d}))

    @torch.no_grad()
    def step(self):
        self.comp(self.x, self.pos)
        return self.comp.pooled


def make(device):
    return Target()
"""


def _fields():
    # ratio 2..4 with 6 audited steps after 2 warmup steps: at least one emitting and one quiet step
    return dict(seed=random.randrange(10**6), d=random.choice([8, 12, 16]), ratio=random.choice([2, 3, 4]),
                cap=32, prompt=random.choice([1, 4, 6]))


def test_the_early_exit_after_the_emitting_block_is_its_own_decision(tmp_path):
    path, site = write_target(tmp_path / "later_exit.py", HAZARD, **_fields())
    bad = blocking(path)
    got = set(zip(bad.line.astype(int), bad.category))
    assert (marked_line(path, "# FIRST"), "data-dependent-control") in got, table(bad)
    assert (site, "data-dependent-control") in got, table(bad)


def test_device_selected_twin_has_no_control_finding(tmp_path):
    path, _ = write_target(tmp_path / "later_exit_clean.py", CLEAN, **_fields())
    bad = blocking(path)
    assert not (bad.category == "data-dependent-control").any(), table(bad)
