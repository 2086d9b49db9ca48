"""A slice bound by a host counter, on a tensor whose shape already varies: a paged cache gathers the blocks of a
Python block table that grows every few positions, then cuts the tokens with `[: pos + 1]`. The slice's input
shape varies, but steps that gathered the same number of blocks still cut other lengths: the bound sets the
shape on its own, so the slice is an origin of dynamic-shape beside the table's (and a baked-host-value), not
only a shape downstream of it. A slice whose length follows its input alone (`[: -1]`) stays downstream."""

from __future__ import annotations

import random

from site_util import at, blocking, table, write_target

TARGET = """
import torch

BS = {bs}

class Paged:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.pool = torch.randn(32, BS, {d}, generator=g)
        self.x = torch.zeros({d}, 1)
        self.out = torch.zeros(1, 1)
        self.pos = {start}

    def prepare(self, i):
        self.x.copy_(torch.randn({d}, 1))

    def step(self):
        pos = self.pos
        blocks = self.pool[: pos // BS + 1]  # TABLE
        keys = blocks.reshape(-1, {d}){cut}  # SITE
        self.out.copy_(torch.softmax(keys @ self.x, dim=0).sum(0, keepdim=True))
        self.pos += 1
        return self.out

def make(device):
    return Paged()
"""


def _write(tmp_path, cut):
    fields = dict(bs=random.choice([2, 3]), seed=random.randrange(1000), d=random.choice([4, 8, 16]),
                  start=random.randrange(2, 10))
    return write_target(tmp_path / "paged_slices.py", TARGET, cut=cut, **fields)


def test_a_host_bound_on_a_varying_tensor_is_a_shape_origin(tmp_path):
    path, site = _write(tmp_path, "[: pos + 1]")
    bad = blocking(path)
    assert len(at(bad, "dynamic-shape", site)) == 1, table(bad)
    assert len(at(bad, "baked-host-value", site)) == 1, table(bad)
    assert len(at(bad, "dynamic-shape", site - 1)) == 1, table(bad)  # the table's own


def test_a_slice_that_follows_its_input_stays_downstream(tmp_path):
    path, site = _write(tmp_path, "[: -1]")
    bad = blocking(path)
    assert at(bad, "dynamic-shape", site).empty, table(bad)
    assert len(at(bad, "dynamic-shape", site - 1)) == 1, table(bad)
