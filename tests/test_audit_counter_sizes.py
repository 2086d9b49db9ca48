"""A size read mixed with a host counter is an origin of its own, not downstream of a varying shape.

A speculative decoder keeps its cache's filled length as a Python int: it slices the cache with
`k[:end]`, `end = self.length + t`, `t = x.shape[0]`, then builds the causal mask with `torch.ones(t, end)`.
The mask's statement reads a size (`t`), and its varying width equals the slice's, so it looked like a size read
off the slice: no finding. But `end` comes from the counter, and attending over the whole cache would leave the
mask varying: it is a dynamic-shape and a baked-host-value of its own. A mask sized off the slice itself
(`keys.shape[0]`) still follows it. The counter may be advanced by the step or set by prepare().
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, marked_line, table, write_target

TARGET = """
import torch

MAX, D, T = 64, {d}, {t}


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.k = torch.randn(MAX, D, generator=g)
        self.x = torch.zeros(T, D)
        self.out = torch.zeros(T, D)
        self.length = {base}

    def prepare(self, i):
        self.x.copy_(torch.randn(T, D))
        {prepare}

    def step(self):
        t = self.x.shape[0]
        end = self.length + t
        keys = self.k[:end]  # ORIGIN
        mask = {mask}  # MASK
        att = (self.x @ keys.t()).masked_fill(mask == 0, float("-inf")).softmax(-1)
        self.out.copy_(att @ keys)
        {advance}
        return self.out


def make(device):
    return Target()
"""

MASKS = {"counter": "torch.ones(t, end).tril(end - t)", "slice": "torch.ones(t, keys.shape[0]).tril(keys.shape[0] - t)"}


@pytest.mark.parametrize("mask", ["counter", "slice"])
@pytest.mark.parametrize("where", ["step", "prepare"])
def test_a_size_mixed_with_a_host_counter_is_its_own_origin(tmp_path, mask, where):
    base = random.randrange(4, 12)
    prepare, advance = ("pass", "self.length += 1") if where == "step" else (f"self.length = {base} + i", "")
    path, _ = write_target(tmp_path / "spec_cache.py", TARGET, "# MASK", seed=random.randrange(2**31), d=random.choice([4, 8]),
                           t=random.choice([2, 3, 4]), base=base, prepare=prepare, advance=advance, mask=MASKS[mask])
    bad = blocking(path)
    origin, line = marked_line(path, "# ORIGIN"), marked_line(path, "# MASK")
    assert len(at(bad, "dynamic-shape", origin)) == 1, table(bad)
    hits = {c for c in ("dynamic-shape", "baked-host-value") if len(at(bad, c, line))}
    assert hits == ({"dynamic-shape", "baked-host-value"} if mask == "counter" else set()), table(bad)
