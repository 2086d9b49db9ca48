"""F.linear on a 3-D input views its flat product back to the input's leading sizes: downstream, not an origin.

A graph transformer regroups a fixed node budget into `num_graphs` molecules with a per-request Python count
(einops' `rearrange(x, "(b n) d -> b n d", b=num_graphs)`, a reshape), then projects with `nn.Linear`; the count
is a parameter or an attribute prepare() sets (a host counter, which a local holding the regrouped tensor is not). Inside
torch the linear runs `view(h, [b * n, d])`, `addmm`, `view(out, [b, n, 3d])`: the last view's sizes change while
its input keeps its shape, so it read as a second dynamic-shape and baked-host-value at the projection's line,
whose only fix is the reshape's. The same view applied to a product the call made from a fixed-shape buffer,
sized by the host count, reads no varying tensor and stays an origin.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, marked_line, table, write_target

TARGET = """
import torch
from torch import nn

BUDGET, D = {budget}, {d}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.proj = nn.Linear(D, 3 * D)
        self.x = torch.zeros(BUDGET, D)
        self.flat = torch.zeros(BUDGET, D)
        self.b = {counts}[0]
        self.gen = torch.Generator().manual_seed({seed})

    def prepare(self, i):
        self.b = {counts}[i % {n_counts}]
        self.x.copy_(torch.randn(BUDGET, D, generator=self.gen))
        self.flat.copy_(torch.randn(BUDGET, D, generator=self.gen))

    @torch.no_grad()
    def step(self):
        return self.forward(self.x, self.b)

    def forward(self, x, b):
        h = {regroup}  # ORIGIN
        {site}  # SITE
        return y.sum(1)


def make(device):
    return Target()
"""

REGROUPS = {"attribute": "x.reshape(self.b, -1, D)", "parameter": "x.reshape(b, -1, D)"}
SITES = {
    "linear": "y = self.proj(h)",
    "fixed": "y = self.proj(self.flat).view(b, -1, 3 * D) + h.sum()",
}


@pytest.mark.parametrize("count", ["attribute", "parameter"])
@pytest.mark.parametrize("kind", ["linear", "fixed"])
def test_a_linear_over_a_regrouped_input_is_downstream(tmp_path, kind, count):
    budget = random.choice([24, 48, 72])
    counts = random.sample([c for c in (2, 3, 4, 6, 8) if budget % c == 0], 4)
    (tmp_path / "target").mkdir()
    path, site = write_target(tmp_path / "target" / "regroup.py", TARGET, seed=random.randrange(2**31),
                              budget=budget, d=random.choice([8, 16]), counts=counts, n_counts=len(counts),
                              site=SITES[kind], regroup=REGROUPS[count])
    bad = blocking(path)
    origin = marked_line(path, "# ORIGIN")
    shapes = bad[bad.category == "dynamic-shape"]
    assert origin in set(shapes.line), table(bad)
    at_site = bad[(bad.line == site) & bad.category.isin(["dynamic-shape", "baked-host-value"])]
    assert len(at_site) == (0 if kind == "linear" else 2), table(bad)
