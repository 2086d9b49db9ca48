"""Host data of a changing length: the line that lifts it is where the shape starts to vary, every time.

A paged cache's block list grows by one block every few positions; a batch's active rows are a Python list.
`torch.tensor(blocks)` or `x[rows]` builds a device tensor of that length in the step, so its shape varies
there: dynamic-shape at that line. The tracer marks an op's input "made in this step" by its TensorImpl
address; the constructor's own copy of the host data can sit at the address of a view the step just freed
(`pool[blk, slot] = x` makes and drops two), which made the lift look like a knock-on of some earlier op and
dropped the finding. And `out[rows] = y` flattens a one-row value with a `view` that a two-row value skips:
torch's indexing chose that op by shape, not a branch of the target's, so it is no data-dependent-control.
"""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

BLOCKS = """
import torch


class Paged:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.pool = torch.zeros(12, {bs}, {d})
        self.x = torch.randn({d}, generator=g)
        self.blocks = [0]
        self.pos = 0

    def prepare(self, i):
        self.x.copy_(torch.randn({d}))
        if i > 0 and i % {bs} == 0:
            self.blocks.append(len(self.blocks))  # host bookkeeping, outside the step

    def step(self):
        self.pool[self.blocks[-1], 0] = self.x
        return self.pool[torch.tensor(self.blocks)].sum()  # SITE


def make(device):
    return Paged()
"""

ROWS = """
import torch


class Rows:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g)
        self.h = torch.randn(4, {d}, generator=g)
        self.out = torch.zeros(4, {d})
        self.rows = [0]

    def prepare(self, i):
        self.rows = [0] if i % 2 else [0, 2]

    def step(self):
        y = self.h[self.rows] @ self.w  # SITE
        self.out[self.rows] = y  # SETITEM
"""


def test_a_growing_host_list_lifted_after_freed_views_is_a_dynamic_shape(tmp_path):
    bs = random.choice([2, 3])
    path, site = write_target(tmp_path / "blocks.py", BLOCKS, seed=random.randrange(2**31), bs=bs,
                              d=random.choice([4, 8]))
    bad = blocking(path)
    dyn = bad[bad.category == "dynamic-shape"]
    assert site in set(dyn.line), table(bad)
    assert "aten.lift_fresh" in set(dyn[dyn.line == site].op), table(bad)


def test_indexing_by_a_host_list_of_one_or_two_rows_is_no_branch(tmp_path):
    path, site = write_target(tmp_path / "rows.py", ROWS + "\n\ndef make(device):\n    return Rows()\n",
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path)
    assert "data-dependent-control" not in set(bad.category), table(bad)
    assert site in set(bad[bad.category == "dynamic-shape"].line), table(bad)
