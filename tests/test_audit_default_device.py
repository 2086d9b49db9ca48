"""Factories naming no device follow torch's default device: host memory only while none is in force.

A target that calls `torch.set_default_device(device)` in make() (model cards do) gets its `torch.arange(n)`
on the GPU there, so reading one back waits for the device; without it the same read is of host memory.
On a CPU scan both defaults are the CPU: only that the target set one tells them apart.
"""

from __future__ import annotations

import random

import pytest
import torch

from site_util import blocking, marked_line, table, write_target

TARGET = """
import torch


class Target:
    def __init__(self, device):
        {setup}
        self.x = torch.zeros(2, {d})
        self.out = torch.zeros(2, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}))

    def step(self):
        lens = torch.arange({d}) * {k}
        n = 1 + int(lens.max()) % {d}  # SITE
        self.out[:, :n].copy_(self.x[:, :n])
        return self.out


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("how", ["none", "set_default_device", "with-block"])
def test_a_factory_read_back_is_a_wait_only_on_the_default_device(tmp_path, how):
    (tmp_path / "target").mkdir()
    setup = "torch.set_default_device(device)" if how == "set_default_device" else "pass"
    path, site = write_target(tmp_path / "target" / "default_device.py", TARGET, setup=setup,
                              d=random.choice([4, 8, 16]), k=random.randint(1, 5))
    if how == "with-block":  # the factory and its read inside one `with torch.device(device):` block
        src = path.read_text().replace("        lens = torch.arange", "        with torch.device('cpu'):\n"
                                       "            lens = torch.arange")
        path.write_text(src)
        site = marked_line(path, "# SITE")
    try:
        bad = blocking(path)
    finally:
        torch.set_default_device(None)
    sync = bad[bad.category == "host-sync"]
    if how == "none":
        assert not len(sync), table(sync)
    else:
        assert list(sync.line) == [site] and sync.iloc[0].file.endswith(path.name), table(bad)
