"""A flag assigned a device test settles which side of an early exit a GPU takes.

SSM mixers pick their fused kernel once (`self.use_fast_path = torch.cuda.is_available()`) and test the flag in the
step: `if self.use_fast_path: return fused(...)`, then a reference path that reads lengths back per row. On a CPU
scan that reference path runs; a GPU never does, so its reads are CPU-only (info), as after `if x.is_cuda:`. A flag
assigned a plain value somewhere as well (`self.use_fast_path = False` in a second method) is not settled by the
device: the read stays blocking.
"""

from __future__ import annotations

import random

import pytest

from site_util import scanned, table, write_target

TARGET = """
import torch


def fused(x, w):
    return torch.tanh(x @ w)


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.x = torch.zeros({b}, {d})
        self.lengths = torch.arange(1, {b} + 1)
        self.{flag} = {test}
{extra}
    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {d}))

    def step(self):
        if self.{flag}:
            return fused(self.x, self.w)
        rows = []
        for r in range(self.x.shape[0]):
            if self.lengths[r].item() == 0:  # SITE
                rows.append(torch.zeros_like(self.x[r]))
                continue
            rows.append(torch.tanh(self.x[r] @ self.w))
        return torch.stack(rows)


def make(device):
    return Target()
"""

EXTRA = """
    def disable_fast_path(self):
        self.{flag} = False
"""


@pytest.mark.parametrize("assigned", ["device", "device-and-plain"])
def test_a_flag_assigned_a_device_test(tmp_path, assigned):
    flag = random.choice(["use_fast_path", "fused_ok", "_kernel"])
    test = random.choice(["torch.cuda.is_available()", "torch.cuda.is_initialized()",
                          "torch.cuda.is_initialized() or torch.cuda.is_available()"])
    extra = EXTRA.format(flag=flag) if assigned == "device-and-plain" else ""
    path, line = write_target(tmp_path / "flag_target.py", TARGET, flag=flag, test=test, extra=extra,
                              seed=random.randrange(2**31), d=random.choice([4, 8]), b=random.choice([2, 3]))
    inv = scanned(path)
    reads = inv.df[(inv.df.category == "host-sync") & (inv.df.line == line)]
    assert len(reads) >= 1, table(inv.df)
    if assigned == "device-and-plain":
        assert (reads.severity == "blocks-capture").any(), table(reads)
        return
    assert (reads.severity == "info").all(), table(reads)
    assert "on the CPU only" in reads.iloc[0].message, table(reads)
    assert not len(inv.blocking()), table(inv.blocking())
