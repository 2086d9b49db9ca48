"""A host pool an object keeps, made by a factory that follows another tensor's device but names the CPU
(`torch.zeros_like(self.dev, device="cpu")`, `self.dev.new_zeros(shape, device="cpu")`) or set up in place after a
host factory (`torch.empty(n, d).share_memory_()`), is pageable host memory: uploading it in the step is a
pageable-copy at the library's line, with the target's call as caller. `torch.zeros_like(self.dev)` with no device
follows the device tensor: no finding."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, table, write_target

LIB = """
import torch

class Pool:
    def __init__(self, rows, d, device):
        self.device = device
        self.dev = torch.zeros(rows, d, device=device)
        self.host = {made}

    def fetch(self):
        return self.host.to(self.device, non_blocking=True)  # LIBSITE
"""

TARGET = """
import torch
from {mod} import Pool

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {d}, device=device)
        self.x = torch.zeros({rows}, {d}, device=device)
        self.out = torch.zeros({rows}, {d}, device=device)
        self.pool = Pool({rows}, {d}, device)

    def prepare(self, i):
        self.x.copy_(torch.randn({rows}, {d}))

    def step(self):
        y = torch.tanh(self.x @ self.w) + self.pool.fetch()  # SITE
        self.out.copy_(y)
        return self.out

def make(device):
    return Target(device)
"""


MADE = {"like": 'torch.zeros_like(self.dev, device="cpu")', "new": 'self.dev.new_zeros((rows, d), device="cpu")',
        "shared": "torch.empty(rows, d).share_memory_().fill_(0.5)", "follows": "torch.zeros_like(self.dev)"}


@pytest.mark.parametrize("how", ["like", "new", "shared", "follows"])
def test_a_host_pool_made_by_a_following_factory_naming_the_cpu(tmp_path, monkeypatch, how):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{made}", MADE[how]), prefix="pool")
    path, site = write_target(tmp_path / "target" / "pool_t.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), rows=random.randint(1, 4))
    bad = blocking(path, forget=mod)
    if how == "follows":
        assert not len(bad), table(bad)
        return
    library_hit(bad, "pageable-copy", lib, path, site)
    assert len(bad) == 1, table(bad)
