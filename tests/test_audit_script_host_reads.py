"""A `.tolist()` inside a `torch.jit.script` function is a host-sync at its line.

TorchScript runs it as `prim::tolist`, which reads the tensor's data without dispatching an op, so the dispatch
mode never sees it (only a baked index further down, if at all). The script call's wrapper reports each such node
once the call returns, when its block ran: the function's own block, or a loop or branch whose aten ops ran. An
untaken branch reads nothing, and a script of device ops only stays clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import torch
from typing import List


@torch.jit.script
def write_rows(cache: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, flag: bool) -> torch.Tensor:
{body}
    return cache


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g)
        self.h = torch.zeros(2, {d})
        self.cache = torch.zeros(64, {d})
        self.slots = torch.zeros(2, dtype=torch.long)

    def prepare(self, i):
        self.h.copy_(torch.randn(2, {d}))
        self.slots.copy_(torch.tensor([i % 30, 32 + i % 30]))

    def step(self):
        return write_rows(self.cache, self.h @ self.w, self.slots, {flag})


def make(device):
    return Target()
"""

BODIES = {
    "own_block": ("""\
    idx: List[int] = slots.tolist()  # SITE
    for r in range(len(idx)):
        cache[idx[r]] = kv[r]""", "False"),
    "loop": ("""\
    for r in range(kv.size(0)):
        s: List[int] = (slots[r:r + 1] + 0).tolist()  # SITE
        cache[s[0]] = kv[r]""", "False"),
    "taken": ("""\
    if flag:
        idx: List[int] = (slots * 1).tolist()  # SITE
        cache[idx[0]] = kv[0]""", "True"),
    "untaken": ("""\
    if flag:
        idx: List[int] = (slots * 1).tolist()  # SITE
        cache[idx[0]] = kv[0]
    cache.index_copy_(0, slots, kv)""", "False"),
    "clean": ("""\
    cache.index_copy_(0, slots, kv)  # SITE""", "False"),
}


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_scripted_tolist_is_a_host_sync_at_its_line(tmp_path, kind):
    body, flag = BODIES[kind]
    path, site = write_target(tmp_path / f"script_reads_{kind}.py", TARGET, body=body, flag=flag,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path)
    reads = bad[bad.category == "host-sync"]
    if kind in ("clean", "untaken"):
        assert not len(reads), table(bad)
        return
    hit = at(bad, "host-sync", site)
    assert len(hit) == 1 and hit.iloc[0].op == "Tensor.tolist", table(bad)
    assert len(reads) == 1, table(bad)
