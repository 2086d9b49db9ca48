"""Rows gathered from a table kept in pageable host memory stay in host memory, whatever indexed them.

A host-offloaded embedding table (`self.cpu_table = torch.randn(V, D)`) is read with an index the step copied
back from the device (`idx = self.ids.cpu()`), then the rows go to the device (`rows.to(D)`): on a GPU that is a
copy from pageable memory. A CPU scan cannot tell the `.cpu()` copy from the device tensor it came from (the
same storage), so the gather looked like an op mixing host and device data. On a GPU an index must be on the
table's side for `index`, `index_select` or `embedding` of a host table to run at all, so the rows are host
memory. A table made on the device, gathered with the same index, is not.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, marked_line, table, write_target

GATHERS = {
    "index": "self.table[idx]",
    "index_select": "torch.index_select(self.table, 0, idx.flatten()).view({b}, {l}, {d})",
    "embedding": "torch.nn.functional.embedding(idx, self.table)",
}

TARGET = """
import torch

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.device = torch.device(device)
        self.table = {table}
        self.proj = torch.nn.Linear({d}, 1).to(device)
        self.ids = torch.zeros({b}, {l}, dtype=torch.long, device=device)
        self.out = torch.zeros({b}, 1, device=device)

    def prepare(self, i):
        self.ids.copy_(torch.randint(0, {v}, ({b}, {l})))

    @torch.no_grad()
    def step(self):
        idx = self.ids.cpu()  # READ
        rows = {gather}.mean(1)
        rows = rows.to(self.device, non_blocking=True)  # SITE
        self.out.copy_(self.proj(rows))
        return self.out


def make(device):
    return Target(device)
"""


def _target(tmp_path, gather: str, table_expr: str):
    b, l, d, v = random.choice([2, 4]), random.choice([3, 5]), random.choice([8, 16]), random.randrange(50, 200)
    return write_target(tmp_path / f"host_table_{gather}.py", TARGET, seed=random.randrange(2**31), b=b, l=l, d=d,
                        v=v, table=table_expr.format(v=v, d=d),
                        gather=GATHERS[gather].format(b=b, l=l, d=d))


@pytest.mark.parametrize("gather", sorted(GATHERS))
def test_rows_gathered_from_a_host_table_sent_to_the_device_are_a_pageable_copy(tmp_path, gather):
    path, site = _target(tmp_path, gather, "torch.randn({v}, {d})")
    bad = blocking(path)
    assert site in set(bad[bad.category == "pageable-copy"].line), table(bad)
    assert marked_line(path, "# READ") in set(bad[bad.category == "host-sync"].line), table(bad)


@pytest.mark.parametrize("gather", sorted(GATHERS))
def test_rows_gathered_from_a_device_table_are_no_pageable_copy(tmp_path, gather):
    path, site = _target(tmp_path, gather, "torch.randn({v}, {d}, device=device)")
    bad = blocking(path)
    assert site not in set(bad[bad.category == "pageable-copy"].line), table(bad)
