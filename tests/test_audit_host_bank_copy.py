"""A table the target's class keeps in pageable host memory (an adapter bank made by a torch factory naming
no device, maybe scaled: `torch.randn(n, d, r) * 0.1`) whose rows reach the device in the step is a copy
from pageable memory, whichever way the rows get there: `.to(D)`, or `copy_` into a persistent device
buffer (`self.cur.copy_(self.bank[i])`). A bank made on the device, or moved there in `__init__`, is not.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

MAKES = {
    "plain": "torch.randn({n}, {d}, generator=g)",
    "scaled": "torch.randn({n}, {d}, generator=g) * 0.1",
    "cast": "(torch.rand({n}, {d}, generator=g) - 0.5).float()",
}
CLEAN_MAKES = {
    "on_device": "torch.randn({n}, {d}, generator=g).to(device) * 0.1",
    "device_kw": "torch.ones({n}, {d}, device=device) * 0.1",
}
SENDS = {
    "copy_in": "self.cur.copy_(self.bank.index_select(0, self.active.view(1))[0])",
    "to_device": "self.cur.copy_(self.bank.index_select(0, self.active.view(1)).to(self.device)[0])",
}

TARGET = """
import torch

class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.device = device
        self.bank = {make}
        self.cur = torch.zeros({d}, device=device)
        self.active = torch.zeros((), dtype=torch.long)
        self.x = torch.zeros(1, {d}, device=device)
        self.out = torch.zeros(1, {d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        self.active.fill_(i % {n})

    def step(self):
        {send}  # SITE
        self.out.copy_(torch.tanh(self.x * self.cur))
        return self.out

def make(device):
    return Target(device)
"""


def _write(tmp_path, make: str, send: str):
    n, d = random.choice([2, 3]), random.choice([4, 8])
    return write_target(tmp_path / "bank_target.py", TARGET, seed=random.randrange(2**31), n=n, d=d,
                        make=make.format(n=n, d=d), send=send)


@pytest.mark.parametrize("make", sorted(MAKES))
@pytest.mark.parametrize("send", sorted(SENDS))
def test_rows_of_a_host_bank_sent_to_the_device_are_a_pageable_copy(tmp_path, make, send):
    path, site = _write(tmp_path, MAKES[make], SENDS[send])
    bad = blocking(path)
    assert len(at(bad, "pageable-copy", site)) == 1, table(bad)


@pytest.mark.parametrize("make", sorted(CLEAN_MAKES))
@pytest.mark.parametrize("send", sorted(SENDS))
def test_a_bank_made_on_the_device_is_not(tmp_path, make, send):
    path, _ = _write(tmp_path, CLEAN_MAKES[make], SENDS[send])
    bad = blocking(path)
    assert not len(bad[bad.category == "pageable-copy"]), table(bad)


@pytest.mark.parametrize("value", ["0", "-1", "0.5 * 2", "torch.float32"])
def test_an_attribute_set_to_a_plain_value_is_no_host_bank(tmp_path, value):
    from audit.detectors.host import attr_memory

    src = tmp_path / "layer.py"
    src.write_text(f"import torch\n\nclass Layer:\n    def reset(self):\n        self.length = {value}\n")
    assert attr_memory.host_factory_attr(str(src), "length") is None
