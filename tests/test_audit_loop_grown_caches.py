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


QUANTIZED = """
import torch


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.q = torch.zeros(2, {d}, dtype=torch.uint8)
        self.res = torch.zeros(0, {d})
        self.scale = torch.rand(1, {d}) + 0.5
        self.x = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.rand(1, {d}) * 4)

    def dequantize(self):
        return self.q.to(torch.float32) * self.scale  # DEQUANT

    @torch.no_grad()
    def step(self):
        self.res = torch.cat([self.res, self.x], dim=0)  # SITE
        full = torch.cat([self.dequantize(), self.res], dim=0)
        if self.res.shape[0] >= {residual}:  # the residual flushed into the quantized part
            self.q = (full / self.scale).round().clamp(0, 255).to(torch.uint8)
            self.res = self.res[:0]
        return full.sum(0)


def make(device):
    return Target()
"""


def test_a_quantized_cache_grows_at_its_cat_not_at_its_dequantize(tmp_path):
    """A KIVI-style cache: a residual grown by a `cat` each step, flushed every few steps into the quantized part
    (the dequantized part and the residual, quantized back). The dequantize reads what an earlier step made from
    its own output, but gives out its input's shape unchanged: the `cat` is the origin."""
    path, site = write_target(tmp_path / "quant_cache.py", QUANTIZED, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), residual=random.choice([2, 3]))
    bad = blocking(path)
    shapes = bad[bad.category == "dynamic-shape"]
    assert site in set(shapes.line) and marked_line(path, "# DEQUANT") not in set(shapes.line), table(bad)
