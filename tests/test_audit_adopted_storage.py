"""Storage made outside the dispatcher inside the step, then handed to a tensor with `set_`:
`copy.deepcopy(t)` (and `UntypedStorage.clone()`) allocate that way. When the result is kept as state
and read by the next step, it escaped exactly like `self.h = torch.cat(...)`: a silent step-allocation
at the copying line, not a stale input pointer at the reader.
"""

from __future__ import annotations

import random

import pytest

import audit
from site_util import at, table, write_target

FORMS = {
    "deepcopy": "self.saved = copy.deepcopy(self.h)",
    "deepcopy_dict": "self.saved = copy.deepcopy({'h': self.h})['h']",
    "storage_clone": "self.saved = torch.empty(0).set_(self.h.untyped_storage().clone()).view_as(self.h)",
}

TARGET = """
import copy
import torch

class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.h = torch.randn(1, {d}, generator=g)
        self.saved = {init}
        self.x = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        mix = 0.5 * (self.h + self.saved)
        {line}  # SITE
        self.h.copy_(torch.tanh(mix @ self.w + self.x))
        return self.h

def make(device):
    return Target()
"""


def _write(tmp_path, line: str, init: str = "torch.zeros_like(self.h)"):
    seed, d = random.randrange(2**31), random.choice([8, 16, 24])
    return write_target(tmp_path / "adopted_target.py", TARGET, seed=seed, d=d, line=line, init=init)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_storage_adopted_in_the_step_and_kept_is_an_escape(tmp_path, form):
    path, site = _write(tmp_path, FORMS[form])
    inv = audit.scan(f"{path}:make", device="cpu")
    bad = inv.blocking()
    esc = at(bad, "step-allocation", site)
    assert len(esc) == 1, table(bad)
    assert "saved" in esc.iloc[0].message
    # the reader is not blamed for a moved input: the step made that storage itself
    assert bad[bad.category == "stale-input-pointer"].empty, bad[["category", "line", "message"]].to_string()


def test_deepcopy_once_and_refilled_in_place_is_clean(tmp_path):
    path, _ = _write(tmp_path, "self.saved.copy_(self.h)", init="copy.deepcopy(self.h)")
    inv = audit.scan(f"{path}:make", device="cpu")
    assert inv.blocking().empty, inv.blocking()[["category", "line", "message"]].to_string()


def test_storage_adopted_and_dropped_is_only_an_allocation(tmp_path):
    path, site = _write(tmp_path, "snap = copy.deepcopy(self.h); mix = mix + 0 * snap")
    inv = audit.scan(f"{path}:make", device="cpu")
    assert inv.blocking().empty, inv.blocking()[["category", "line", "message"]].to_string()
    assert not inv.df[(inv.df.category == "step-allocation") & (inv.df.line == site)].empty
