"""A flag assigned a device test settles which side of an early exit a GPU takes.

SSM mixers pick their fused kernel once (`self.use_fast_path = torch.cuda.is_available()`) and test the flag in the
step: `if self.use_fast_path: return fused(...)`, then a reference path that reads lengths back per row. On a CPU
scan that reference path runs; a GPU never does, so its reads are CPU-only (info), as after `if x.is_cuda:`. A flag
assigned a plain value somewhere as well (`self.use_fast_path = False` in a second method) is not settled by the
device: the read stays blocking. A flag whose own class gives only a plain default is what the object that builds
it sets (`self.mixer.use_fast_path = torch.device(device).type == "cuda"`).
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


OWNED = """
import torch


class Mixer:
    def __init__(self, d):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn(d, d, generator=g) * 0.1
        self.{flag} = False

    def forward(self, x, lengths):
        if self.{flag}:
            return torch.tanh(x @ self.w)
        rows = []
        for r in range(x.shape[0]):
            if lengths[r].item() == 0:  # SITE
                rows.append(torch.zeros_like(x[r]))
                continue
            rows.append(torch.tanh(x[r] @ self.w))
        return torch.stack(rows)


class Runner:
    def __init__(self, device, fast):
        self.mixer = Mixer({d})
        self.mixer.{flag} = {test}
        self.x = torch.zeros({b}, {d})
        self.lengths = torch.arange(1, {b} + 1)

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {d}))

    def step(self):
        return self.mixer.forward(self.x, self.lengths)


def make(device):
    return Runner(device, fast=False)
"""


@pytest.mark.parametrize("owner_sets", ["device", "config"])
def test_a_plain_default_the_owner_sets_to_a_device_test(tmp_path, owner_sets):
    """The mixer's own class gives the flag a plain `False`; the runner that builds it sets it from the device
    (`self.mixer.use_fast_path = torch.device(device).type == "cuda"`): the flag is the owner's device test. Set
    from a config argument instead, nothing settles it."""
    flag = random.choice(["use_fast_path", "fused_ok", "_kernel"])
    test = random.choice(['torch.device(device).type == "cuda"', 'torch.device(device).type != "cpu"',
                          "torch.cuda.is_available()"]) if owner_sets == "device" else "fast"
    path, line = write_target(tmp_path / "owned_flag_target.py", OWNED, flag=flag, test=test,
                              seed=random.randrange(2**31), d=random.choice([4, 8]), b=random.choice([2, 3]))
    inv = scanned(path)
    reads = inv.df[(inv.df.category == "host-sync") & (inv.df.line == line)]
    assert len(reads) >= 1, table(inv.df)
    if owner_sets == "config":
        assert (reads.severity == "blocks-capture").any(), table(reads)
        return
    assert (reads.severity == "info").all(), table(reads)
    assert not len(inv.blocking()), table(inv.blocking())
