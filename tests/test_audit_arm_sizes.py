"""A size read off a tensor that one arm of a fork made in some steps and the other arm in the rest follows it.

timm's NaFlex ViT adds its learned position table per image grid: the table as it is (`pos.reshape(1, h * w,
-1)`) when the grid is the table's own, an interpolation to the grid otherwise; then it adds the first
`n = min(x.shape[1], pos.shape[1])` rows. The grid is a host value, so the interpolation is an origin (its
baked size and dynamic shape) and the branch is a data-dependent-control; the slice by `n` reads its size off
`pos`, made by the interpolation in most steps and by the reshape in the step whose grid is the table's, so no
one call made it in every step. It is downstream of those findings, not a new origin.
"""

from __future__ import annotations

import random

from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import torch
import torch.nn.functional as F


class GridPos(torch.nn.Module):
    def __init__(self, dim=8, grid=4):
        super().__init__()
        self.pos = torch.nn.Parameter(torch.randn(1, dim, grid, grid))

    def forward(self, x, grid):
        g = self.pos.shape[-1]
        if grid[0] == g and grid[1] == g:  # BRANCH
            pos = self.pos.reshape(1, x.shape[-1], g * g).transpose(1, 2)
        else:
            pos = F.interpolate(self.pos, size=grid, mode="bilinear").flatten(2).transpose(1, 2)  # INTERP
        n = min(x.shape[1], pos.shape[1])
        return x[:, :n] + pos[:, :n]  # SLICE
"""

TARGET = """
import torch
import {mod} as lib

GRIDS = {grids}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.pos = lib.GridPos()
        self.x = torch.zeros(1, 64, 8)
        self.grid = GRIDS[0]

    def prepare(self, i):
        self.grid = GRIDS[i % len(GRIDS)]
        self.x.normal_()

    @torch.no_grad()
    def step(self):
        return self.pos(self.x, self.grid)  # SITE


def make(device):
    return Target()
"""


def _grids():
    others = random.sample([(h, w) for h in range(2, 8) for w in range(2, 8) if (h, w) != (4, 4)], 5)
    at = random.choice([3, 4, 5])  # the table's own grid in one audited step (steps 2..5), not the first
    return others[:at] + [(4, 4)] + others[at:]


def test_size_read_off_either_arm_follows_the_fork(tmp_path, monkeypatch):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="naflexlib")
    path, _ = write_target(tmp_path / "target" / "arm_target.py", TARGET, mod=mod, grids=_grids(),
                           seed=random.randrange(1000))
    bad = blocking(path, forget=mod)
    interp, slc = marked_line(lib, "# INTERP"), marked_line(lib, "# SLICE")
    at_interp = bad[bad.line == interp]
    assert {"dynamic-shape", "baked-host-value"} <= set(at_interp.category), table(bad)
    assert marked_line(lib, "# BRANCH") in set(bad[bad.category == "data-dependent-control"].line), table(bad)
    at_slice = bad[(bad.line == slc) & bad.category.isin(["dynamic-shape", "baked-host-value"])]
    assert at_slice.empty, table(bad)
