"""A host tensor kept beside device tensors is host memory whatever its size: reading it waits for nothing.

A VLM step keeps the processor's image grid as it came (`self.image_grid_thw = torch.tensor([[1, 4, 4]])`, no
device, a [n_images, 3] CPU tensor beside device tensors; or in a dataclass of request metadata, in the dict of
processor outputs kept as they came, or a module-level table of supported grids) and its get_rope_index-style
helper reads it with `.tolist()` every step. The host-tensor rules left 2-D and large host tensors out (their uploads are pageable copies), which made such reads a host-sync on
a CPU scan. The same grid placed on the device stays a host-sync.
"""

from __future__ import annotations

import random

import pytest

from site_util import scanned, table, write_target

TARGET = """
from dataclasses import dataclass

import torch

TABLE = torch.tensor({grid})


@dataclass
class Meta:
    grid: torch.Tensor


def delta(grid, merge):
    span = n = 0
    for t, h, w in {read}:  # SITE
        span += max(t, h // merge, w // merge)
        n += t * (h // merge) * (w // merge)
    return span - n


class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g).to(device)
        self.x = torch.zeros(1, {d}, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.grid = torch.tensor({grid}{where})
        self.meta = Meta(grid=torch.tensor({grid}{where}))
        self.inputs = {{"input_ids": torch.tensor([[1, 2]]), "grid": torch.tensor({grid}{where})}}

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        self.pos.add_(1 + delta({holder}, 2) * 0)
        return self.x @ self.w + self.pos


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize("holder", ["self.grid", "self.meta.grid", "TABLE", 'self.inputs["grid"]'])
@pytest.mark.parametrize("read", ["grid.tolist()", "grid[{row}:].tolist()"])
def test_reading_a_kept_2d_host_tensor_is_no_host_sync(tmp_path, on_device, holder, read):
    n = random.randint(1, 3)
    grid = [[random.randint(1, 2), 2 * random.randint(1, 4), 2 * random.randint(1, 4)] for _ in range(n)]
    if holder == "TABLE" and on_device:
        pytest.skip("a module-level table is made at import, before the target names a device")
    where = ", device=device" if on_device else ""
    path, site = write_target(tmp_path / "grid_target.py", TARGET, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), grid=grid, read=read.format(row=random.randrange(n)),
                              where=where, holder=holder)
    inv = scanned(path)
    syncs = inv.df[(inv.df.category == "host-sync") & (inv.df.severity != "info")]
    if on_device:
        assert len(syncs) == 1 and syncs.iloc[0].line == site, table(inv.df)
        return
    assert not len(inv.blocking()), table(inv.blocking())
