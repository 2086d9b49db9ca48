"""Planted dynamic-shape hazards (and a graph-safe twin): shapes that grow or shrink per step.

Only the op where a shape starts to vary is a finding; its consumers inherit the shape. Where a
Python value sets the shape (a slice bound, a size), that value is baked into the graph as well:
both findings stand, each with its own fix.
"""

import torch


class Dynamic:
    def __init__(self, device):
        self.buf = torch.zeros(32, device=device)
        self.cache = torch.zeros(0, 4, device=device)
        self.x = torch.zeros(4, device=device)
        self.n = 1

    def prepare(self, i):
        self.x.copy_(torch.randn(4))
        self.buf.copy_(torch.randn(32))
        self.n = 2 + i

    def step(self):
        self.cache = torch.cat([self.cache, self.x[None]])  # HAZARD: dynamic-shape, step-allocation
        head = self.buf[: self.n]  # HAZARD: dynamic-shape, baked-host-value
        ramp = torch.arange(self.n, dtype=torch.float32, device=self.x.device)  # HAZARD: dynamic-shape, baked-host-value
        pad = torch.zeros(self.n, device=self.x.device)  # HAZARD: dynamic-shape, baked-host-value
        tiled = self.x.repeat(self.n)  # HAZARD: dynamic-shape, baked-host-value
        return self.cache.sum(0) + (head * ramp + pad).sum() + tiled.sum()


class DynamicClean:
    """Fixed maximum shapes with masks; the cache is a preallocated ring written in place."""

    def __init__(self, device):
        self.buf = torch.zeros(32, device=device)
        self.cache = torch.zeros(16, 4, device=device)
        self.x = torch.zeros(4, device=device)
        self.n = torch.zeros((), dtype=torch.long, device=device)
        self.idx = torch.arange(32, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(4))
        self.buf.copy_(torch.randn(32))
        self.n.fill_(2 + i)

    def step(self):
        self.cache.index_copy_(0, (self.n % 16).reshape(1), self.x[None])
        valid = self.idx < self.n
        head = torch.where(valid, self.buf, 0.0)
        ramp = torch.where(valid, self.idx.float(), 0.0)
        tiled = torch.where(self.idx[:16] < 4 * self.n, self.x.repeat(4), 0.0)
        return self.cache.sum(0) + (head * ramp).sum() + tiled.sum()


def make(device):
    return Dynamic(device)


def make_clean(device):
    return DynamicClean(device)
