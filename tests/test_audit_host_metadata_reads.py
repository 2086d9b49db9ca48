"""Reading back what torch computed from a tensor the target keeps on the host on purpose waits for nothing.

Serving engines keep sequence lengths on the host (`self.seqlens_cpu`, made with `device="cpu"`) so that
kernels can size their work without a sync: `int(self.seqlens_cpu.max())` or `.sum().item()` runs on
the CPU on a GPU too, in the target or in a library it calls. A CPU scan, where every tensor is a host
tensor, must not call that a host-sync. The same read of a device tensor still is one.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import torch

class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.lens = torch.full(({b},), {n}, dtype=torch.long{where})
        self.x = torch.zeros({b}, {d})
        self.out = torch.zeros({b}, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {d}))

    def step(self):
        n = {read}  # SITE
        self.out.copy_(torch.tanh(self.x @ self.w)[:, :n].sum(-1, keepdim=True).expand({b}, {d}))
        return self.out

def make(device):
    return Target(device)
"""

READS = ["int(self.lens.max())", "self.lens.max().item()", "(self.lens + 0).min().tolist() // 1",
         "int((self.lens * 2).max()) // 2"]


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("on_host", [True, False])
def test_a_read_of_host_kept_metadata_is_no_sync(tmp_path, read, on_host):
    d = random.choice([8, 16])
    path, site = write_target(tmp_path / "meta_target.py", TARGET, seed=random.randrange(2**31), d=d,
                              b=random.choice([1, 2, 4]), n=random.randrange(1, d), read=read,
                              where=', device="cpu"' if on_host else "")
    bad = blocking(path)
    hits = at(bad, "host-sync", site)
    if on_host:
        assert not len(hits), table(bad)
    else:
        assert len(hits) >= 1, table(bad)
