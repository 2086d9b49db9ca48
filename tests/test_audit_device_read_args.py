"""baked-host-value: an int torch reads from a device tensor passed where an int goes is the host-sync's.

transformers' ConfidenceCriteria writes `probs[0, input_ids[0, -1]].item()`: indexing with a 0-dim integer
device tensor makes torch read the index (`.item()` inside its indexing) and hand the int to `aten.select`.
The select's argument then changed with the data and was reported as a baked-host-value beside the
host-sync, with the fix "keep the value in a device tensor", which the code already did. The read is the one
finding (at that line); a slice bound given as a 0-dim tensor (`x[:, :n]`, Python's `__index__`) likewise
keeps its dynamic-shape but is no baked value. Twins: an index the target keeps in host memory is a host
value (baked, no host-sync), and an explicit `int(i)` the code writes stays its own read and its own value.
Sizes, values and spellings are drawn fresh."""

from __future__ import annotations

import random

import pytest
from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.table = torch.randn({rows}, {cols}, generator=g)
        self.idx = torch.zeros((), dtype=torch.long{where})
        self.out = torch.zeros({rows})

    def prepare(self, i):
        self.idx.fill_(({stride} * i + 1) % {cols})

    def step(self):
        picked = {expr}  # SITE
        self.out.copy_(picked * {scale})
        return self.out


def make(device):
    return Target()
"""

EXPRS = {"device": ["self.table[:, self.idx]", "self.table.t()[self.idx]"],
         "bound": ["self.table[:, :self.idx + 1].sum(-1)"],
         "host": ["self.table[:, self.idx]"],
         "explicit": ["self.table[:, int(self.idx)]", "self.table[:, self.idx.item()]"]}


@pytest.mark.parametrize("kind", sorted(EXPRS))
def test_an_index_torch_reads_from_the_device_is_one_host_sync(tmp_path, kind):
    rows, cols = random.choice([3, 5, 6]), random.choice([7, 9, 11])
    path, site = write_target(tmp_path / "read_args.py", TEMPLATE, seed=random.randrange(2**31), rows=rows,
                              cols=cols, stride=random.choice([2, 3, 4]), scale=round(random.uniform(0.5, 2.0), 3),
                              where=', device="cpu"' if kind == "host" else "", expr=random.choice(EXPRS[kind]))
    bad = blocking(path)
    syncs, baked = at(bad, "host-sync", site), at(bad, "baked-host-value", site)
    if kind == "host":  # host memory: no wait, but the kernel argument is a host value that changes
        assert not len(syncs) and len(baked) == 1, table(bad)
    elif kind == "explicit":  # the code's own conversion: its read, then its Python value
        assert len(syncs) == 1 and len(baked) == 1, table(bad)
    else:
        assert len(syncs) == 1 and not len(baked), table(bad)
    if kind == "bound":
        assert len(at(bad, "dynamic-shape", site)) == 1, table(bad)
    assert set(bad.line) == {site}, table(bad)
