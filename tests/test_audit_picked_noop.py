"""A callee picked by a host key where one of the picks runs no op (a KV quantizer chosen per request from
`nn.ModuleDict({"auto": nn.Identity(), "fp8": ...})`, or a dict of functions with `lambda x: x`): one step runs
extra ops the other does not, with no branch around them; the pick is the decision, not the line that calls
the picked callee. A key that stays the same is clean."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch
from torch import nn


class Dispatch(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.mods = nn.ModuleDict({"none": nn.Identity(), "lin": nn.Linear(d, d), "act": nn.Tanh()})
        self.fns = {"none": lambda x: x, "lin": self._lin, "act": torch.tanh}
        self.key = "none"

    def _lin(self, x):
        return self.mods["lin"](x) * 0.5

    def forward(self, h):
        {pick}  # LIBSITE
        return {call}
"""

PICKS = [("q = self.mods[self.key]", "q(h)"), ("fn = self.fns[self.key]", "fn(h)")]


@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_pick_where_one_callee_runs_no_op(tmp_path, monkeypatch, kind):
    pick, call = random.choice(PICKS)
    other = random.choice(["lin", "act"])
    prep = (f'        self.dsp.key = ["none", "{other}"][(i + {random.randint(0, 1)}) % 2]' if kind == "hit"
            else f'        self.dsp.key = "{random.choice(["none", other])}"')
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB.replace("{pick}", pick).replace("{call}", call),
                                          "pickednoop", "Dispatch", "self.dsp(self.x)",
                                          init="        self.dsp = Dispatch({d})", prepare=prep)
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "data-dependent-control", lib, path, site)
