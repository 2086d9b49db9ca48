"""A host buffer a library class keeps, made by a conditional expression of two host factories (a swap space
pinned on request: `torch.zeros(shape, pin_memory=True) if pin else torch.zeros(shape)`), is host memory on a
GPU whichever arm ran. The pageable arm: a device value copied into it is a device->host copy that waits
(host-sync), and sending a row of it to the device in the step is a pageable copy. The pinned arm: neither."""

from __future__ import annotations

import random

import pytest

from site_util import SWAP_TARGET, blocking, install_library, library_hit, table, write_target

LIB = """
import torch

class Swap:
    def __init__(self, n, block, d, device, pin):
        shape = (n, block, d)
        self.host = {factory}
        self.dev = torch.zeros(block, d, device=device)
        self.device = device

    def out(self, blk, i):
        self.host[i].copy_(blk, non_blocking=True)  # LIBSITE_OUT
        return blk

    def fetch(self, blk, i):
        return blk + self.host[i].to(self.device)  # LIBSITE_FETCH
"""

FACTORIES = ["torch.zeros(shape, pin_memory=True) if pin else torch.zeros(shape)",
             "torch.zeros(shape) if not pin else torch.zeros(shape, pin_memory=True)",
             "torch.empty(shape, pin_memory=pin) if pin else torch.zeros(shape)"]


@pytest.mark.parametrize("method", ["out", "fetch"])
@pytest.mark.parametrize("pin", [False, True])
def test_a_conditionally_pinned_host_buffer(tmp_path, monkeypatch, method, pin):
    lib_src = LIB.replace("{factory}", random.choice(FACTORIES))
    mod, lib = install_library(tmp_path, monkeypatch, lib_src, prefix="cswap")
    n = random.randint(3, 6)
    path, site = write_target(tmp_path / "target" / "cond_swap.py", SWAP_TARGET, mod=mod, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), block=random.randint(2, 4), n=n, pin=pin, method=method,
                              slot=random.randrange(n))
    bad = blocking(path, forget=mod)
    if pin:
        assert not len(bad), table(bad)
        return
    library_hit(bad, "host-sync" if method == "out" else "pageable-copy", lib, path, site,
                marker="# LIBSITE_OUT" if method == "out" else "# LIBSITE_FETCH")
    assert len(bad) == 1, table(bad)
