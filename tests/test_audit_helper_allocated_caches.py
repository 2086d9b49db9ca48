"""A cache engine allocating its device cache and its host swap cache with one helper of its file, the device
passed in by the call (vLLM's `self.cpu_cache = self._allocate_kv_cache(n, "cpu")`, the helper returning
`[torch.zeros(shape, pin_memory=pin, device=device) for _ in layers]`): the host cache is pageable memory on a
GPU. A swap-in copying a block of it into the device cache is a pageable copy, a swap-out into it a
device->host copy that waits (host-sync), each at the library's copy with the target's call as caller. Pinned
(asked for by the run), or copying within the device cache: no finding."""

from __future__ import annotations

import random
import sys

import pytest

from site_util import blocking, install_library, library_hit, table, write_target

LIB = """
import torch


def alloc_fn(n, block, d, device, pin=False):
    return [torch.zeros((n, block, d), pin_memory=pin and device == "cpu", device=device) for _ in range({layers})]


class Engine:
    def __init__(self, n_dev, n_host, block, d, device, pin):
        self.pin = pin
        self.dev_cache = {alloc_dev}
        self.host_cache = {alloc_host}
        for t in self.host_cache:
            t.normal_()

    def _alloc(self, n, block, d, device):
        return [torch.zeros((n, block, d), pin_memory=self.pin and device == "cpu", device=device) for _ in range({layers})]

    @staticmethod
    def _static_alloc(n, block, d, device, pin=False):
        return [torch.zeros((n, block, d), pin_memory=pin and device == "cpu", device=device) for _ in range({layers})]

    def swap_in(self, src, dst):
        for i in range(len(self.dev_cache)):
            self.dev_cache[i][dst].copy_(self.host_cache[i][src], non_blocking=True)  # LIBSITE_IN
        return self.dev_cache[0][dst]

    def swap_out(self, x, src, dst):
        for i in range(len(self.dev_cache)):
            self.dev_cache[i][src].add_(x)
            self.host_cache[i][dst].copy_(self.dev_cache[i][src], non_blocking=True)  # LIBSITE_OUT
        return self.dev_cache[0][src]

    def copy_dev(self, src, dst):
        for i in range(len(self.dev_cache)):
            self.dev_cache[i][dst].copy_(self.dev_cache[i][src])
        return self.dev_cache[0][dst]
"""

ALLOCS = [("self._alloc(n_dev, block, d, device)", 'self._alloc(n_host, block, d, "cpu")'),
          ("self._alloc(n_dev, block, d, device=device)", 'self._alloc(n_host, block, d, device="cpu")'),
          ("alloc_fn(n_dev, block, d, device, pin)", 'alloc_fn(n_host, block, d, "cpu", pin)'),
          ("alloc_fn(n_dev, block, d, device=device, pin=pin)", 'alloc_fn(n_host, block, d, device="cpu", pin=pin)'),
          ("self._static_alloc(n_dev, block, d, device, pin)", 'self._static_alloc(n_host, block, d, "cpu", pin)'),
          ("Engine._static_alloc(n_dev, block, d, device=device, pin=pin)", 'Engine._static_alloc(n_host, block, d, "cpu", pin)')]

TARGET = """
import torch
from {mod} import Engine

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.x = torch.zeros({block}, {d}, device=device)
        self.out = torch.zeros({block}, {d}, device=device)
        self.eng = Engine({n}, {n}, {block}, {d}, device, {pin})

    def prepare(self, i):
        self.x.copy_(torch.randn({block}, {d}))

    def step(self):
        y = {call}  # SITE
        self.out.copy_(y + self.x)
        return self.out

def make(device):
    return Target(device)
"""

CALLS = {"in": "self.eng.swap_in({a}, {b})", "out": "self.eng.swap_out(torch.tanh(self.x), {a}, {b})",
         "dev": "self.eng.copy_dev({a}, {b})"}


@pytest.mark.parametrize("kind", ["in", "out", "in-pinned", "out-pinned", "dev"])
def test_a_host_cache_from_the_engine_allocation_helper(tmp_path, monkeypatch, kind):
    dev_alloc, host_alloc = random.choice(ALLOCS)
    src = LIB.replace("{alloc_dev}", dev_alloc).replace("{alloc_host}", host_alloc).replace("{layers}", str(random.randint(1, 3)))
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="swapeng")
    n = random.randint(3, 6)
    a, b = random.sample(range(n), 2)
    path, site = write_target(tmp_path / "target" / "swap_engine.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), block=random.randint(2, 4), n=n, pin=kind.endswith("pinned"),
                              call=CALLS[kind.split("-")[0]].format(a=a, b=b))
    bad = blocking(path, forget=mod)
    if kind in ("in", "out"):
        library_hit(bad, "pageable-copy" if kind == "in" else "host-sync", lib, path, site,
                    marker="# LIBSITE_IN" if kind == "in" else "# LIBSITE_OUT")
        assert len(bad) == 1, table(bad)
    else:
        assert not len(bad), table(bad)


ALLOC_LIB = """
import torch


def {fn}(n, block, d, device, pin_memory=False):
    return torch.zeros((n, block, d), device=device, pin_memory=pin_memory)
"""

POOL_LIB = """
import torch
from {alloc} import {fn}


class Engine:
    def __init__(self, n_dev, n_host, block, d, device, pin):
        self.dev_cache = [{fn}(n_dev, block, d, device)]
        self.host_cache = [{fn}(n_host, block, d, {host}, pin_memory=pin)]
        self.host_cache[0].normal_()

    def swap_in(self, src, dst):
        self.dev_cache[0][dst].copy_(self.host_cache[0][src], non_blocking=True)  # LIBSITE_IN
        return self.dev_cache[0][dst]
"""


@pytest.mark.parametrize("pin", [False, True])
def test_a_host_cache_from_a_helper_of_another_module(tmp_path, monkeypatch, pin):
    fn = random.choice(["allocate_blocks", "make_cache", "_alloc_kv"])
    alloc, _ = install_library(tmp_path, monkeypatch, ALLOC_LIB.replace("{fn}", fn), prefix="kvalloc")
    host = random.choice(['"cpu"', 'device="cpu"'])
    mod, lib = install_library(tmp_path, monkeypatch, POOL_LIB.replace("{alloc}", alloc).replace("{fn}", fn)
                               .replace("{host}", host), prefix="kvpool")
    n = random.randint(3, 6)
    a, b = random.sample(range(n), 2)
    path, site = write_target(tmp_path / "target" / "swap_pool.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), block=random.randint(2, 4), n=n, pin=pin,
                              call=f"self.eng.swap_in({a}, {b})")
    bad = blocking(path, forget=mod)
    sys.modules.pop(alloc, None)
    if pin:
        assert not len(bad), table(bad)
        return
    library_hit(bad, "pageable-copy", lib, path, site, marker="# LIBSITE_IN")
    assert len(bad) == 1, table(bad)
