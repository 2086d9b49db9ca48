"""A loop over a library's modules whose trip count comes from a host value (a cross network's
`for layer in self.layers[: self.depth]: x = layer(x0, x)`, `depth` set per request) runs one more layer in
one step than in the other: the extra ops run the same lines as the last layer both ran, on another module.
The data-dependent-control finding names the loop (or the guard in its body that stops it), not the layer's
line, with the target's call as caller. A constant depth is clean."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, write_target

LIB = """
import torch
from torch import nn

class Cross(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x0, x):
        return x0 * self.lin(x) + x

class Net(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.layers = nn.ModuleList(Cross(d) for _ in range(n))
        self.depth = n

    def forward(self, x0):
        x = x0
{loop}
        return x
"""

LOOPS = {"slice": ("        for layer in self.layers[: self.depth]:  # LIBSITE\n"
                   "            x = layer(x0, x)"),
         "guard": ("        for i, layer in enumerate(self.layers):\n"
                   "            if i >= self.depth:  # LIBSITE\n"
                   "                break\n"
                   "            x = layer(x0, x)"),
         "range": ("        for i in range(self.depth):  # LIBSITE\n"
                   "            x = self.layers[i](x0, torch.tanh(x))")}

TARGET = """
import torch
from {mod} import Net

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.net = Net({d}, {n})
        self.x = torch.zeros(2, {d})
        self.out = torch.zeros(2, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}))
        {depth}

    @torch.no_grad()
    def step(self):
        y = self.net(self.x)  # SITE
        self.out.copy_(y)
        return self.out

def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("loop", sorted(LOOPS))
@pytest.mark.parametrize("kind", ["varies", "clean"])
def test_a_module_loop_whose_trip_count_is_host_data(tmp_path, monkeypatch, loop, kind):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{loop}", LOOPS[loop]), prefix="cross")
    n = random.randint(3, 5)
    lo = random.randint(1, n - 2)
    depth = f"self.net.depth = {lo} + i % 2" if kind == "varies" else f"self.net.depth = {lo}"
    path, site = write_target(tmp_path / "target" / "cross_t.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), n=n, depth=depth)
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "data-dependent-control", lib, path, site)
