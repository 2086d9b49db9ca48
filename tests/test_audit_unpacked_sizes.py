"""A size bound by a tuple assignment, or used as the bound of a slice written to, is still a read size.

A rotary table module in the lucidrains style reads its sequence length as one element of a tuple assignment
(`device, dtype, seq_len = t.device, t.dtype, t.shape[seq_dim]`), passes it down to a helper that makes the
positions with `torch.arange(seq_len)` and to one that caches the frequencies with `self.cached[:seq_len] =
freqs`. When the keys handed in grow by `torch.cat` in the step, both calls' shapes follow the cat's: they are
downstream of that one dynamic shape, not new origins (neither a dynamic-shape nor a baked-host-value there).
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import torch


class Table(torch.nn.Module):
    def __init__(self, dim, max_len=64):
        super().__init__()
        self.register_buffer("cached", torch.zeros(max_len, dim), persistent=False)
        self.register_buffer("inv", torch.linspace(1.0, 0.01, dim), persistent=False)

    def positions(self, n, device):
        return torch.arange(n, device=device)  # POSITIONS

    def remember(self, n):
        self.cached[:n] = 0.0  # WRITE

    def forward(self, t):
        {unpack}
        pos = self.positions(n, device)
        self.remember(n)
        return pos[:, None].float() * self.inv
"""

UNPACKS = {
    "elementwise": "device, dtype, n = t.device, t.dtype, t.shape[-2]",
    "whole": "n, d = t.shape[-2:]\n        device = t.device",
}

TARGET = """
import torch
import {mod} as lib


class Target:
    def __init__(self):
        self.table = lib.Table(8)
        self.k = torch.zeros(1, {n0}, 8)
        self.x = torch.zeros(1, 1, 8)

    def prepare(self, i):
        self.x.fill_(float(i))

    def step(self):
        self.k = torch.cat([self.k, self.x], dim=-2)  # ORIGIN
        return self.table(self.k)  # SITE


def make(device):
    return Target()
"""


@pytest.mark.parametrize("unpack", sorted(UNPACKS))
def test_sizes_unpacked_or_slicing_a_write_follow_the_growing_cat(tmp_path, monkeypatch, unpack):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{unpack}", UNPACKS[unpack]), prefix="rotary")
    path, site = write_target(tmp_path / "target" / "grow_target.py", TARGET, mod=mod, n0=random.choice([3, 5]))
    bad = blocking(path, forget=mod)
    origin = marked_line(path, "# ORIGIN")
    shapes = bad[bad.category == "dynamic-shape"]
    assert set(shapes.line) == {origin}, table(bad)
    for mark in ("# POSITIONS", "# WRITE"):
        line = marked_line(lib, mark)
        hits = bad[(bad.line == line) & bad.category.isin(["dynamic-shape", "baked-host-value"])]
        assert hits.empty, (mark, table(bad))
