"""stale-input-pointer where the step itself rebinds the module attribute it then reads.

A hot adapter swap written as `self.layer.A, self.layer.B = self.pool[name]` inside the step makes the layer's
`x @ self.A` read another storage each step. The read is in the layer; the fix (copy_ the chosen adapter into one
static buffer) is at the step's assignment, so that is the finding's line. The same rebinding done in prepare()
stays reported at the read (prepare() is outside the audited step); copy_ of the chosen adapter into the layer's
buffers in prepare() is clean (in the step, the copy's source would be the pool entry picked at capture).
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, marked_line, table, write_target

TARGET = """
import torch
from torch import nn


class LoRALinear(nn.Module):
    def __init__(self, d, r):
        super().__init__()
        self.base = nn.Linear(d, d)
        self.A = torch.zeros(d, r)
        self.B = torch.zeros(r, d)

    def forward(self, x):
        return self.base(x) + (x @ self.A) @ self.B  # READ


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.layer = LoRALinear({d}, {r})
        self.pool = {{n: (torch.randn({d}, {r}) * 0.1, torch.randn({r}, {d}) * 0.1) for n in {names}}}
        self.x = torch.zeros(2, {d})
        self.current = {names}[0]

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}))
        self.current = {names}[i % {n}]
        {in_prepare}

    @torch.no_grad()
    def step(self):
        {in_step}  # SITE
        return self.layer(self.x)


def make(device):
    return Target()
"""

SWAPS = {"rebind": "self.layer.A, self.layer.B = self.pool[self.current]",
         "copy": "[p.copy_(q) for p, q in zip((self.layer.A, self.layer.B), self.pool[self.current])]"}


@pytest.mark.parametrize("where", ["step", "prepare", "copy"])
def test_the_steps_own_rebinding_is_the_findings_line(tmp_path, where):
    n = random.choice([2, 3])
    names = tuple(random.sample(["sql", "math", "chat", "code", "law"], n))
    swap = SWAPS["copy" if where == "copy" else "rebind"]
    in_step, in_prepare = (swap, "pass") if where == "step" else ("pass", swap)
    path, site = write_target(tmp_path / "swap_target.py", TARGET, seed=random.randrange(2**31), n=n, names=names,
                              d=random.choice([8, 16]), r=random.choice([2, 4]), in_step=in_step, in_prepare=in_prepare)
    bad = blocking(path)
    stale = bad[bad.category == "stale-input-pointer"]
    if where == "copy":
        assert stale.empty, table(bad)
        return
    want = site if where == "step" else marked_line(path, "# READ")
    assert set(stale.line) == {want}, table(bad)
    if where == "step":
        assert f":{marked_line(path, '# READ')}" in stale.iloc[0].message, table(stale)
