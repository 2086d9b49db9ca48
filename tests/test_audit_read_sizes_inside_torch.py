"""baked-host-value: a size torch derives inside one op from a value it read back is the host-sync's.

`F.one_hot(ids)` without `num_classes` (a frequency penalty's token counts) reads `ids.max()` back and makes
`zeros([..., max + 1])`: the changing size is the device value, and the fix is the host-sync's (`num_classes=V`).
The line is a host-sync and a dynamic-shape, not also a baked-host-value. A read the code writes itself on the
same line (`torch.zeros(b, int(ids.max()) + 1)`) is its own Python value and stays baked. Sizes and value
ranges are drawn fresh."""

from __future__ import annotations

import random

from site_util import at, blocking, table, write_target

TARGET = """
import torch
import torch.nn.functional as F


class Runner:
    def __init__(self, device):
        self.ids = torch.zeros({b}, {l}, dtype=torch.long, device=device)
        self.out = torch.zeros({b}, {v}, device=device)

    def prepare(self, i):
        self.ids.copy_(torch.randint(0, {lo} + 3 * i, ({b}, {l})))

    @torch.no_grad()
    def step(self):
        counts = {counts}  # SITE
        self.out.zero_()
        self.out[:, : counts.shape[-1]].copy_(counts.float())
        return self.out


def make(device):
    return Runner(device)
"""


def _target(tmp_path, own_read: bool):
    b, l, lo = random.choice([2, 3]), random.choice([16, 24]), random.choice([20, 30])
    if own_read:
        counts = "torch.zeros({b}, int(self.ids.max()) + 1, device=self.ids.device).scatter_add_(1, self.ids, " \
                 "torch.ones_like(self.ids, dtype=torch.float))".format(b=b)
    else:
        counts = random.choice(["F.one_hot(self.ids).sum(1)", "torch.nn.functional.one_hot(self.ids).sum(dim=1)"])
    return write_target(tmp_path / "read_sizes.py", TARGET, b=b, l=l, v=lo + 40, lo=lo, counts=counts)


def test_one_hot_size_is_the_reads(tmp_path):
    path, site = _target(tmp_path, own_read=False)
    bad = blocking(path)
    assert len(at(bad, "host-sync", site)) == 1, table(bad)
    assert len(at(bad, "dynamic-shape", site)) == 1, table(bad)
    assert not len(at(bad, "baked-host-value", site)), table(bad)


def test_own_read_stays_baked(tmp_path):
    path, site = _target(tmp_path, own_read=True)
    bad = blocking(path)
    assert len(at(bad, "baked-host-value", site)) == 1, table(bad)
