"""A device value copied into a large host buffer an object of the target keeps in pageable memory (a KV swap
space made with `torch.zeros(n, block, d)` beside device tensors) is a device->host copy that waits on a GPU,
non_blocking or not: host-sync at the library's copy, with the target's call as caller. Into a pinned buffer
with non_blocking=True it is a memcpy node, and refilling it from host rows reads no device value: no finding."""

from __future__ import annotations

import random

import pytest

from site_util import SWAP_TARGET, blocking, install_library, library_hit, table, write_target

LIB = """
import torch

class Swap:
    def __init__(self, n, block, d, device, pin):
        self.host = torch.zeros(n, block, d, pin_memory=pin)
        self.dev = torch.zeros(block, d, device=device)
        self.rows = torch.ones(block, d)

    def out(self, blk, i):
        self.host[i].copy_(blk, non_blocking=True)  # LIBSITE
        return blk

    def out_host(self, blk, i):
        self.host[i].copy_(self.rows)
        return blk
"""


@pytest.mark.parametrize("kind", ["pageable", "pinned", "host-rows"])
def test_device_values_into_a_kept_pageable_buffer(tmp_path, monkeypatch, kind):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="swap")
    n = random.randint(3, 6)
    path, site = write_target(tmp_path / "target" / "kept_swap.py", SWAP_TARGET, mod=mod, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), block=random.randint(2, 4), n=n,
                              pin=kind == "pinned", method="out_host" if kind == "host-rows" else "out",
                              slot=random.randrange(n))
    bad = blocking(path, forget=mod)
    if kind != "pageable":
        assert not len(bad), table(bad)
        return
    library_hit(bad, "host-sync", lib, path, site)
    assert len(bad) == 1, table(bad)
