"""Host data built straight onto the device (`torch.tensor(vals, device=x.device)`) is one pageable-copy, at that
line. Copying the result on into a persistent device buffer (`self.table.copy_(t)`) or sending it with `.to(D)` is a
device-to-device copy: no second finding there. Host data built on the host and copied in is reported at the copy."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, table, write_target

LIB = """
import torch

class Table:
    def __init__(self, n, device):
        self.table = torch.zeros(n, dtype=torch.int64, device=device)
        self.vals = list(range({base}, {base} + n))

    def refresh(self, x, how):
        if how == "copy":
            t = torch.tensor(self.vals, dtype=torch.int64, device=x.device)  # LIBSITE-copy
            self.table.copy_(t)
        elif how == "to":
            t = torch.tensor(self.vals, dtype=torch.int64, device=x.device)  # LIBSITE-to
            self.table.add_(t.to(x.device))
        else:
            t = torch.tensor(self.vals, dtype=torch.int64)
            self.table.copy_(t)  # LIBSITE-host
        return x + self.table[:1].to(x.dtype)
"""

TARGET = """
import torch
from {mod} import Table

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {d}, device=device)
        self.x = torch.zeros(1, {d}, device=device)
        self.out = torch.zeros(1, {d}, device=device)
        self.tab = Table({n}, device)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        y = self.tab.refresh(torch.tanh(self.x @ self.w), "{how}")  # SITE
        self.out.copy_(y)
        return self.out

def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("how", ["copy", "to", "host"])
def test_data_built_on_the_device_is_one_copy(tmp_path, monkeypatch, how):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{base}", str(random.randint(0, 50))), prefix="tab")
    path, site = write_target(tmp_path / "target" / "tab_t.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), n=random.randint(2, 6), how=how)
    bad = blocking(path, forget=mod)
    library_hit(bad, "pageable-copy", lib, path, site, marker=f"# LIBSITE-{how}")
    assert len(bad) == 1, table(bad)
