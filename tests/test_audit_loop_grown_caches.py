"""dynamic-shape origin of a cache grown several times per step, then cropped.

A draft model run K times per step on a DynamicCache-style cache grows keys and values with one `torch.cat`
each per call and the verifier crops them back by an accepted count that changes between steps. The first
`cat` of a step reads the last `cat` (or the crop) of the step before, which reads the `cat` before it in its
own step, back to the first: the loop is the origin, one dynamic-shape at the cat line. The reads are followed
by tensor address; the keys' old tensor is freed by the keys' `cat` and the values' `cat` right after may reuse
its address, which must not count as having made it."""

from __future__ import annotations

import random

from site_util import blocking, marked_line, table, write_target

TEMPLATE = """
import torch


class Layer:
    def __init__(self, d):
        self.keys = torch.zeros(1, 2, d)
        self.values = torch.zeros(1, 2, d)

    def update(self, k, v):
        self.keys = torch.cat([self.keys, k], dim=1)  # SITE
        self.values = torch.cat([self.values, v], dim=1)
        return self.keys, self.values

    def crop(self, n):
        if n > 0:
            self.keys = self.keys[:, :-n]
            self.values = self.values[:, :-n]


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, 3 * {d}, generator=g) * 0.1
        self.layer = Layer({d})
        self.x = torch.zeros(1, 1, {d})
        self.plan = {plan}
        self.n = 0

    def prepare(self, i):
        self.x.copy_(torch.randn(1, 1, {d}))
        self.n = self.plan[i % len(self.plan)]

    def step(self):
        h = self.x
        for _ in range({k}):
            q, k, v = (h @ self.w).chunk(3, dim=-1)
            keys, values = self.layer.update(k, v)
            h = torch.softmax(q @ keys.transpose(1, 2), -1) @ values
        self.layer.crop(self.n)
        return h


def make(device):
    return Target()
"""


def test_a_cache_grown_in_a_loop_and_cropped_is_one_origin(tmp_path):
    k = random.choice([3, 4, 5])
    plan = [random.randrange(k) for _ in range(2)] + random.sample(range(k), 3) + [k - 1]
    path, _ = write_target(tmp_path / f"loop_grown_{random.randrange(10**6)}.py", TEMPLATE,
                           seed=random.randrange(1000), d=random.choice([8, 12, 16]), k=k, plan=plan)
    bad = blocking(path)
    shapes = bad[bad.category == "dynamic-shape"]
    assert marked_line(path, "# SITE") in set(shapes.line.astype(int)), table(bad)
