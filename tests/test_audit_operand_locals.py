"""A local that holds a tensor made with a size read among its arguments is an operand, not a size.

A data-parallel attention step pads to the longest rank: `padded = torch.zeros(world * n, x.shape[1])`, then
`dist.all_gather_into_tensor(padded, self.hidden[:n])`. With one rank (a scan) the slice's varying length equals
the buffer's (the count `n` read back from the device, no host counter), and the slice's statement reads `padded`, whose assignment reads `x.shape[1]`: it read as a size
taken off the varying buffer, so the slice was dropped as downstream of it, though its bound `n` is a host value
of its own (dynamic-shape and baked-host-value at the slice). A local bound to a size (`m = x.size(0)`, or one
through arithmetic and plain calls, `m = max(x.shape[0], 1)`, `math.ceil(...)`) still makes a read.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, table, write_target

TARGET = """
import math

import torch


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.hidden = torch.randn({rows}, {d}, generator=g)
        self.w = torch.randn({d}, {d}, generator=g)
        self.count = torch.zeros((), dtype=torch.long)

    def prepare(self, i):
        self.count.fill_(2 + (i * {stride}) % {span})

    def step(self):
        n = {read}
        {alloc}  # MADE
        {use}
        return out @ self.w


def make(device):
    return Target()
"""

ALLOCS = {
    "operand": ["padded = torch.zeros(n, self.hidden.shape[1])", "padded = self.hidden.new_zeros(n, self.hidden.size(-1))"],
    "size": ["m = max(self.hidden[:n].shape[0], 1)", "m = math.ceil(self.hidden[:n].size(0) / 1)"],
}
USES = {
    "operand": "out = padded + self.hidden[:n]  # SITE",
    "size": "out = torch.ones(m, {d})  # SITE",
}


@pytest.mark.parametrize("kind", ["operand", "size"])
def test_a_tensor_local_is_no_size_read(tmp_path, kind):
    d = random.choice([8, 16])
    path, site = write_target(tmp_path / "pad_target.py", TARGET, seed=random.randrange(2**31), d=d,
                              rows=random.choice([12, 16]), stride=random.choice([1, 3]), span=random.choice([5, 7]),
                              read=random.choice(["int(self.count)", "self.count.item()"]),
                              alloc=random.choice(ALLOCS[kind]), use=USES[kind].format(d=d))
    bad = blocking(path)
    here = set(bad[bad.line == site].category)
    if kind == "operand":  # the slice's own host bound: an origin beside the buffer's
        assert {"dynamic-shape", "baked-host-value"} <= here, table(bad)
    else:  # `torch.ones(m)`, m a size read off the varying slice: downstream of it
        assert not here & {"dynamic-shape", "baked-host-value"}, table(bad)
