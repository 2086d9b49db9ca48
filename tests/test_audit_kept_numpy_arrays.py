"""A numpy array the target keeps and refills in place, wrapped with `torch.from_numpy` in the step, is no baked
host value.

A grammar bitmask built on the host into `self.mask_np` (refilled with `self.mask_np[:] = ...` in prepare())
and uploaded in the step with `torch.from_numpy(self.mask_np).to(device)` is host data the step wraps, but the
wrapper aliases the kept array: a copy of it reads that memory whenever it runs, so the values prepare() wrote
are not frozen. The upload is the pageable-copy. An array bound anew in prepare() (a new address every step),
one made in the step, or host work on the wrap before the send (`.clone()`: new host data with this step's
values) stays a baked host value. Sizes, names and the data are drawn fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import numpy as np
import torch


class Masked:
    def __init__(self, device):
        self.device = device
        self.{arr} = np.zeros(({b}, {w}), dtype=np.int32)
        self.shifts = torch.arange(32, dtype=torch.int32, device=device)
        self.x = torch.zeros({b}, {w} * 32, device=device)

    def prepare(self, i):
        {refill}
        self.x.copy_(torch.randn({b}, {w} * 32))

    @torch.no_grad()
    def step(self):
        bm = torch.from_numpy({source}){host}.to(self.device, non_blocking=True)  # SITE
        bits = ((bm.unsqueeze(-1) >> self.shifts) & 1).flatten(1)
        return self.x.masked_fill(bits == 0, float("-inf"))


def make(device):
    return Masked(device)
"""

DATA = "np.random.randint(-2**31, 2**31 - 1, size=({b}, {w}), dtype=np.int32)"
FORMS = {  # (prepare's refill, what the step wraps, host work on the wrap before the send)
    "kept": ("self.{arr}[:] = " + DATA, "self.{arr}", ""),
    "rebound": ("self.{arr} = " + DATA, "self.{arr}", ""),
    "fresh": ("pass", DATA, ""),
    "derived": ("self.{arr}[:] = " + DATA, "self.{arr}", ".clone()"),
}


def _target(tmp_path, form):
    fields = dict(b=random.choice([1, 2, 3]), w=random.choice([2, 4, 8]),
                  arr=random.choice(["mask_np", "bitmask_host", "allowed_np"]))
    refill, source, fields["host"] = FORMS[form]
    fields["refill"] = refill.format(**fields)
    fields["source"] = source.format(**fields)
    return write_target(tmp_path / f"kept_numpy_{form}.py", TARGET, **fields)


def test_a_kept_array_refilled_in_place_is_no_baked_value(tmp_path):
    path, site = _target(tmp_path, "kept")
    bad = blocking(path)
    assert not len(at(bad, "baked-host-value", site)), table(bad)
    assert len(at(bad, "pageable-copy", site)) == 1, table(bad)


@pytest.mark.parametrize("form", ["rebound", "fresh", "derived"])
def test_an_array_made_anew_each_step_stays_baked(tmp_path, form):
    path, site = _target(tmp_path, form)
    bad = blocking(path)
    assert len(at(bad, "baked-host-value", site)) == 1, table(bad)
    assert len(at(bad, "pageable-copy", site)) == 1, table(bad)
