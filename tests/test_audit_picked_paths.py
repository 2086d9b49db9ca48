"""A method picked by a host key whose paths begin alike: the pick is the decision.

A hybrid stack runs `fn = {"all": self._all, "even": self._even}[self.mode]; return fn(h)`; both methods first
run layer 0 through one helper, so the two steps' op sequences agree on those ops and part later, inside
each method's loop. The finding named the loops of the two methods (one per step), not the line that chose
between them. When the anchor both steps ran was reached through two different functions called from one
line, that line's pick (a computed key: a subscript, `getattr(self, f"_{mode}")`) is named; a mode that stays
the same is clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch
from torch import nn


class Stack(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
        self.mode = "all"

    def _run(self, i, h):
        return torch.tanh(self.layers[i](h))

    def _all(self, h):
        for i in range(len(self.layers)):
            h = self._run(i, h)
        return h

    def _even(self, h):
        for i in range(0, len(self.layers), 2):
            h = self._run(i, h)
        return h

    def forward(self, h):
        fn = {pick}  # LIBSITE
        return fn(h)
"""

PICKS = ['{"all": self._all, "even": self._even}[self.mode]', 'getattr(self, f"_{self.mode}")']


@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_pick_between_paths_that_begin_alike(tmp_path, monkeypatch, kind):
    n = random.randint(3, 5)
    prep = '        self.stack.mode = ["all", "even"][i % 2]' if kind == "hit" else '        self.stack.mode = "even"'
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB.replace("{pick}", random.choice(PICKS)),
                                          "picked", "Stack", "self.stack(self.x)", init=f"        self.stack = Stack({{d}}, {n})",
                                          prepare=prep)
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "data-dependent-control", lib, path, site)
