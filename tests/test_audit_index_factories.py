"""Index factories (`torch.triu_indices(n, n, 1)`, `tril_indices`; window functions and `logspace` too) are
born in host memory when they name no device, like `torch.arange`: a DLRM-style dot interaction that builds its
pair indices per call and sends them with `.to(z.device)` copies from pageable memory every step (a
pageable-copy at the library's line, the target's call its caller). Built once on the device in `__init__`,
or in the step with `device=`, they are no copy."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, write_target

LIB = """
import torch

class Pairs:
    def __init__(self, n, device):
        self.n = n
        self.li = torch.triu_indices(n, n, 1, device=device)

    def __call__(self, z):
        idx = {made}  # LIBSITE
        return z[:, idx[0], idx[-1]]
"""

TARGET = """
import torch
from {mod} import Pairs

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.x = torch.zeros({b}, {n}, {d}, device=device)
        self.pairs = Pairs({n}, device)
        self.out = torch.zeros({b}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {n}, {d}))

    def step(self):
        z = torch.bmm(self.x, self.x.transpose(1, 2))
        flat = self.pairs(z)  # SITE
        self.out.copy_(flat.sum(1))
        return self.out

def make(device):
    return Target(device)
"""

MADE = {"triu": "torch.triu_indices(self.n, self.n, offset=1).to(z.device)",
        "tril": "torch.tril_indices(self.n, self.n, -1).to(z.device, non_blocking=True)",
        "on_device": "torch.triu_indices(self.n, self.n, offset=1, device=z.device)",
        "init": "self.li"}
CLEAN = {"on_device", "init"}


@pytest.mark.parametrize("how", sorted(MADE))
def test_an_index_factory_naming_no_device_sent_to_the_device(tmp_path, monkeypatch, how):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{made}", MADE[how]), prefix="pairs")
    path, site = write_target(tmp_path / "target" / "pairs_t.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              b=random.randint(1, 4), n=random.randint(3, 6), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "clean" if how in CLEAN else how, "pageable-copy", lib, path, site)
    assert len(bad) == (0 if how in CLEAN else 1), bad
