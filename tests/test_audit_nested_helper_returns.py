"""pageable-copy: a cached helper whose host tensor wraps a list a nested function builds.

ALiBi slopes in the lucidrains style: `@lru_cache def alibi_slopes(heads)` defines `def power_of_2(n): return
[...]` inside and returns `torch.tensor(power_of_2(heads))`, a host tensor; forward moves it with `.to(x.device)`
every step, a copy from pageable memory that capture refuses. The nested function's `return [...]` is its own
result, not the helper's: the helper's one return is a host tensor. The twin builds it on the device
(`torch.tensor(..., device=device)`, keyed by device): clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import functools
import math

import torch
from torch import nn


@functools.lru_cache(maxsize=None)
def {fn}(heads):
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    return torch.tensor(power_of_2(heads))


@functools.lru_cache(maxsize=None)
def {fn}_on(heads, device):
    def power_of_2(n):
        return [2.0 ** (-(i + 1)) for i in range(n)]
    return torch.tensor(power_of_2(heads), device=device)


class Bias(nn.Module):
    def __init__(self, heads, on_device):
        super().__init__()
        self.heads, self.on_device = heads, on_device

    def forward(self, x):
        if self.on_device:
            return x * {fn}_on(self.heads, x.device)[:, None]
        slopes = {fn}(self.heads).to(x.device)  # MOVE
        return x * slopes[:, None]


class Target:
    def __init__(self):
        self.bias = Bias({heads}, {on_device})
        self.x = torch.ones({heads}, 4)
        self.out = torch.zeros({heads}, 4)

    def prepare(self, i):
        self.x.fill_(float(i))

    def step(self):
        self.out.copy_(self.bias(self.x))  # SITE
        return self.out


def make(device):
    return Target()
"""


@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_nested_function_returns_are_not_the_helpers(tmp_path, kind):
    (tmp_path / "target").mkdir()
    fn = random.choice(["alibi_slopes", "_slopes", "get_slopes"])
    path, _ = write_target(tmp_path / "target" / "alibi_target.py", TARGET, fn=fn, heads=random.choice([4, 8]),
                           on_device=kind == "clean")
    bad = blocking(path)
    move = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if "# MOVE" in s)
    hits = at(bad, "pageable-copy", move)
    assert len(hits) == (1 if kind == "hit" else 0), table(bad)
    assert len(bad[bad.category == "pageable-copy"]) == len(hits), table(bad)
