"""A value torch reads back from a 0-dim device index is the host-sync's, not a baked host value
(audit/detectors/tensors/read_values.py).

`self.table[self.pos]` with `pos` a 0-dim integer device tensor: torch's indexing calls `.item()` on it (the
host-sync at that line) and hands the Python int to `select`, whose argument then changes every step. That int
is the device value itself, not a host value a capture freezes; the host-sync's fix (a `[1]`-shaped index)
removes both. A Python int the target keeps on the host and indexes with is still a baked-host-value, and so
is a 0-dim tensor kept in host memory (a counter built without a device): its read is no host-sync.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, write_target

TEMPLATE = """
import torch


class Step:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.table = torch.randn({rows}, {d}, generator=g).to(device)
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        self.lo = torch.zeros((), dtype=torch.long, device=device)
        self.host_pos = 0
        self.host_count = torch.tensor({start})  # a host counter: host memory on a GPU too
        self.x = torch.zeros(1, {d}, device=device)
        self.out = torch.zeros(1, {d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        self.host_pos = ({start} + i) % {rows}
        self.host_count.fill_({start} + 3 * i)
        self.lo.fill_(({start} + 2 * i) % ({rows} - 1))

    @torch.no_grad()
    def step(self):
        row = {index}  # SITE
        self.out.copy_(self.x * row)
        self.pos.add_(1)
        return self.out


def make(device):
    return Step(device)
"""

INDEX = {
    "0-dim device index": ("self.table[self.pos]", {"host-sync"}),
    "tensor slice bounds": ("self.table[self.lo:self.lo + 1]", {"host-sync"}),
    "host int index": ("self.table[self.host_pos]", {"baked-host-value"}),
    # torch reads a 0-dim host tensor too, but that read waits for nothing: its value is a host value
    "0-dim host tensor index": ("self.table[self.host_count % {rows}]", {"baked-host-value"}),
}


@pytest.mark.parametrize("kind", sorted(INDEX))
def test_a_read_back_index_is_one_host_sync(tmp_path, kind):
    index, want = INDEX[kind]
    rows = random.randint(12, 40)
    path, site = write_target(tmp_path / f"idx_{random.randrange(10**6)}.py", TEMPLATE, seed=random.randrange(10**6),
                              rows=rows, d=random.randint(3, 17), start=random.randint(0, rows - 8), index=index.format(rows=rows))
    bad = blocking(path)
    assert set(bad.category) == want, bad.to_string()
    for cat in want:
        assert len(at(bad, cat, site)) == 1, bad.to_string()
