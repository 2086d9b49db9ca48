"""dynamic-shape origins across steps.

A cache that the step grows at its end (`self.cache = tree_map(lambda o, n: torch.cat([o, n], 1), ...)`) is read
at the start of the next step. The read takes a tensor from outside the step whose shape varies, yet it only
follows the `cat` of the step before: the one dynamic-shape is at the `cat`, not at every op that reads the cache.
An input that prepare() grows is still an origin where the step first reads it, and a `cat` whose input another
op of the previous step made from the cat's own output (`self.k = torch.cat(...) * 1.0`) stays an origin."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, marked_line, table, write_target

TEMPLATE = """
import torch
from torch.utils import _pytree as pytree


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.x = torch.zeros(1, 1, {d})
        self.cache = {{"{key}": torch.zeros(1, 2, {d})}}

    def prepare(self, i):
        self.x.copy_(torch.randn(1, 1, {d}))
{prepare}

    def step(self):
        q = self.x @ self.w
        att = torch.softmax(q @ self.cache["{key}"].transpose(1, 2), -1)  # READ
        y = att @ self.cache["{key}"]
{grow}
        return y


def make(device):
    return Target()
"""

GROW = {
    "end": '        self.cache = pytree.tree_map(lambda o: torch.cat([o, q], dim=1), self.cache)  # SITE',
    "chained": '        self.cache["{key}"] = torch.cat([self.cache["{key}"], q], dim=1) * 1.0  # SITE',
    "prepare": "",
}


@pytest.mark.parametrize("kind", ["end", "chained", "prepare"])
def test_a_cache_grown_at_the_step_end_is_one_origin(tmp_path, kind):
    key = random.choice(["k", "keys", "layer0"])
    prep = (f'        self.cache["{key}"] = torch.cat([self.cache["{key}"], torch.randn(1, 1, self.x.shape[-1])], 1)'
            if kind == "prepare" else "")
    path, _ = write_target(tmp_path / f"carried_{kind}_{random.randrange(10**6)}.py", TEMPLATE, marker="# READ",
                           seed=random.randrange(1000), d=random.choice([8, 12, 16]), key=key,
                           grow=GROW[kind].format(key=key), prepare=prep)
    bad = blocking(path)
    shapes = bad[bad.category == "dynamic-shape"]
    if kind == "prepare":
        assert marked_line(path, "# READ") in set(shapes.line.astype(int)), table(bad)
    else:
        assert set(shapes.line.astype(int)) == {marked_line(path, "# SITE")}, table(bad)
