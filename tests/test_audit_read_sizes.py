"""A size read off a tensor whose shape already varies is downstream of the dynamic shape, not a new origin.

A graph library drops self loops with `edge_index[:, mask]` (a data-dependent number of edges), then makes
the edge weights with `torch.ones((edge_index.size(1),))`. The factory takes no tensor input, so its varying
output looked like an origin: dynamic-shape and baked-host-value at a line whose only fix is the mask's. The
same factory sized by a Python count the caller passes in (equal to the edge count, but read from no tensor)
is where that host value enters, and stays reported. The size may reach the factory through a local
(`n = edge_index.size(1)`) or a helper's parameter (`ones_for(edge_index, edge_index.shape[1])`).
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import torch


def ones_for(edge_index, n):
    return torch.ones((n,), device=edge_index.device)  # {helper_mark}


def degree(edge_index, num_nodes, n_edges=None):
    mask = edge_index[0] != edge_index[1]
    edge_index = edge_index[:, mask]  # ORIGIN
    {body}
    return torch.zeros(num_nodes, device=edge_index.device).scatter_add_(0, edge_index[1], weight)
"""

BODIES = {
    "local": "n = {size}\n    weight = torch.ones((n,), device=edge_index.device)  # FACTORY",
    "param": "weight = ones_for(edge_index, {size})",
    "count": "weight = ones_for(edge_index, n_edges)",
}

TARGET = """
import torch
import {mod} as lib

N, E = {n}, {e}


class Target:
    def __init__(self):
        self.gen = torch.Generator().manual_seed({seed})
        self.edge_index = torch.zeros(2, E, dtype=torch.long)
        self.out = torch.zeros(N)
        self.n_edges = E

    def prepare(self, i):
        ei = torch.randint(0, N, (2, E), generator=self.gen)
        loops = i % 3
        ei[1] = (ei[0] + 1 + ei[1] % (N - 1)) % N
        ei[1, :loops] = ei[0, :loops]
        self.edge_index.copy_(ei)
        self.n_edges = E - loops

    def step(self):
        self.out.copy_(lib.degree(self.edge_index, N, self.n_edges))  # SITE
        return self.out


def make(device):
    return Target()
"""


@pytest.mark.parametrize("kind", ["local", "param", "count"])
def test_a_factory_sized_from_a_varying_tensor_is_downstream(tmp_path, monkeypatch, kind):
    size = random.choice(["edge_index.size(1)", "edge_index.shape[1]", "edge_index[0].numel()"])
    body = BODIES[kind].format(size=size)
    source = LIB.format(body=body, helper_mark="HELPER" if kind == "local" else "FACTORY")
    mod, lib = install_library(tmp_path, monkeypatch, source, prefix="graphs")
    path, site = write_target(tmp_path / "target" / "graph_target.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              n=random.choice([8, 12]), e=random.choice([16, 24]))
    bad = blocking(path, forget=mod)
    origin, factory = marked_line(lib, "# ORIGIN"), marked_line(lib, "# FACTORY")
    shapes = bad[bad.category == "dynamic-shape"]
    assert origin in set(shapes.line) and (shapes.caller_line == site).all(), table(bad)
    at_factory = bad[(bad.line == factory) & bad.category.isin(["dynamic-shape", "baked-host-value"])]
    assert len(at_factory) == (2 if kind == "count" else 0), table(bad)
