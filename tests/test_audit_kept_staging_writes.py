"""Host values written into a large pageable host buffer the target keeps are host work, not a device copy or a
baked value.

xgrammar's token bitmask (`self.bitmask = torch.zeros(B, W, dtype=torch.int32)` beside device tensors) is filled
by a host matcher in the step (`bitmask[r, w] = v`, or `row[allowed] = True` with a Python list of the allowed
ids) and then sent with `.to(device)`. The send is the pageable-copy; the writes happen in host memory, so no
scalar or index goes to a device and no kernel freezes the values: the refill a replay skips is the
cpu-side-effect at the writing line. Only buffers of two dimensions or many elements were missed (the small
ones were already host tensors). The same writes into a device buffer stay what they were. Sizes, names and
the write form are drawn fresh."""

from __future__ import annotations

import random

from site_util import at, blocking, marked_line, table, write_target

TARGET = """
import torch


class Filler:
    def __init__(self, device):
        self.w = torch.randn({v}, {v}, device=device)
        self.{buf} = torch.zeros({b}, {v}, dtype=torch.int32{where})
        self.x = torch.zeros({b}, {v}, device=device)
        self.device = device
        self.k = 0

    def allowed(self, r):
        return [(self.k * {stride} + r + j) % {v} for j in range({n})]

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {v}))

    @torch.no_grad()
    def step(self):
        self.k += 1
        for r in range({b}):
            {write}  # SITE
        mask = self.{buf}.to(self.device)  # SEND
        return (self.x @ self.w).masked_fill(mask == 0, -1e4)


def make(device):
    return Filler(device)
"""

WRITES = ["self.{buf}[r, (r * {stride}) % {v}] = self.k * {stride} + r",
          "self.{buf}[r][self.allowed(r)] = 1"]


def _target(tmp_path, on_device: bool, form: int):
    fields = dict(b=random.choice([2, 3]), v=random.choice([16, 24, 32]), n=random.choice([3, 5]),
                  stride=random.choice([3, 5, 7]), buf=random.choice(["bitmask", "token_mask", "allowed_host"]))
    fields["where"] = ", device=device" if on_device else ""
    fields["write"] = WRITES[form].format(**fields)
    path, site = write_target(tmp_path / "staging_writes.py", TARGET, **fields)
    return path, site, marked_line(path, "# SEND")


def test_writes_into_a_kept_pageable_buffer_are_host_work(tmp_path):
    path, site, send = _target(tmp_path, on_device=False, form=random.randrange(2))
    bad = blocking(path)
    assert not len(at(bad, "baked-host-value", site)), table(bad)
    assert not len(at(bad, "pageable-copy", site)), table(bad)
    assert len(at(bad, "cpu-side-effect", site)) == 1, table(bad)
    assert len(at(bad, "pageable-copy", send)) == 1, table(bad)


def test_the_same_writes_into_a_device_buffer_stay_findings(tmp_path):
    form = random.randrange(2)
    path, site, _ = _target(tmp_path, on_device=True, form=form)
    bad = blocking(path)
    assert len(at(bad, "baked-host-value" if form == 0 else "pageable-copy", site)), table(bad)
