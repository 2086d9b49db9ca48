"""`len()` of a Python list the step appends to is a host counter, not a size read off a tensor: two caches cut
with `[:, :n]` after `n = len(self.scales)` (a quantized cache keeping each step's scales in a list) are two
origins of a dynamic shape, the second no more downstream of the first than of any tensor sharing that size."""

from __future__ import annotations

import random

import audit
from site_util import at, table, write_target

TARGET = """
import torch


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.a = torch.randn(1, {cap}, {d}, device=device)
        self.b = torch.randn(1, {cap}, {d}, device=device)
        self.x = torch.zeros(1, 1, {d}, device=device)
        self.scales = []
        self.pos = torch.zeros(1, dtype=torch.long, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, 1, {d}))
        self.pos.fill_(i)

    @torch.no_grad()
    def step(self):
        {grow}
        n = {n}
        ka = self.a[:, :n] * 2.0  # SITE
        kb = self.b[:, :n] * 3.0  # SITE2
        return (ka.sum(1, keepdim=True) + kb.sum(1, keepdim=True)) * self.x


def make(device="cpu"):
    return Target(device)
"""


def _scan(tmp_path, grow: str, n: str):
    fields = dict(seed=random.randrange(2**31), cap=random.choice([24, 32]), d=random.choice([8, 16]), grow=grow, n=n)
    path, site = write_target(tmp_path / "grown_target.py", TARGET, **fields)
    return audit.scan(f"{path}:make", device="cpu", steps=4).blocking(), site


def test_each_cut_by_a_grown_lists_length_is_an_origin(tmp_path):
    bad, site = _scan(tmp_path, "self.scales.append(self.x.abs().amax())", "len(self.scales)")
    for line in (site, site + 1):
        assert len(at(bad, "dynamic-shape", line)) == 1, table(bad)


def test_a_fixed_window_is_clean(tmp_path):
    bad, _ = _scan(tmp_path, "pass", "self.a.shape[1]")
    assert len(bad) == 0, table(bad)
