"""A list state moved to the host after each update holds host copies, not the step's device tensors.

torchmetrics' `compute_on_cpu=True` appends an update's device tensor to a list state and rebinds the list to
`[v.to("cpu") for v in vals]`. On a CPU scan `.to("cpu")` returns the tensor itself, so the next step's `.to` of
the held element read as a device allocation escaping into a later step (step-allocation, silent). On a GPU the
list keeps the host copy and that later `.to` reads host memory: the copy is a host-sync, nothing escaped. The
same list moved with `.to(self.device)` keeps the device tensors, and the escape stands.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, marked_line, table, write_target

TARGET = """
import torch


class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.device = device
        self.w = torch.randn({d}, {k}, generator=g)
        self.x = torch.zeros({b}, {d})
        self.vals = []

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {d}))

    def step(self):
        v = (self.x @ self.w).softmax(-1).amax(-1)  # ALLOC
        self.vals.append(v)
        self.vals = [t.to({where}) for t in self.vals]  # SITE
        return v


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("where", ["host", "device"])
def test_a_state_moved_home_keeps_no_device_allocation(tmp_path, where):
    dest = random.choice(['"cpu"', 'torch.device("cpu")', 'device="cpu"']) if where == "host" else "self.device"
    path, site = write_target(tmp_path / "moved_target.py", TARGET, seed=random.randrange(2**31), where=dest,
                              d=random.choice([4, 8]), k=random.choice([3, 5]), b=random.choice([2, 3]))
    bad = blocking(path)
    alloc = marked_line(path, "# ALLOC")
    escaped = bad[(bad.category == "step-allocation") & (bad.line == alloc)]
    if where == "host":
        assert len(bad[(bad.category == "host-sync") & (bad.line == site)]), table(bad)
        assert not len(escaped), table(bad)
    else:
        assert len(escaped), table(bad)
