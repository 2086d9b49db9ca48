"""Planted stale-input-pointer hazards (and a graph-safe twin): inputs rebound by prepare().

The step is fine on its own; the staging is the bug: prepare() makes new tensors each step,
so a replayed graph keeps reading the ones that existed at capture.
"""

import torch


class Rebinds:
    def __init__(self, device):
        self.device = device
        self.w = torch.randn(8, 8, device=device)
        self.prepare(0)

    def prepare(self, i):
        self.x = torch.randn(8, device=self.device)
        self.ids = torch.randint(0, 8, (2,), device=self.device)
        self.extras = [torch.randn(8, device=self.device)]

    def step(self):
        h = self.w @ self.x  # HAZARD: stale-input-pointer
        rows = self.w.index_select(0, self.ids)  # HAZARD: stale-input-pointer
        bias = self.extras[0] * 0.5  # HAZARD: stale-input-pointer
        return h + rows.sum(0) + bias


class RebindsClean:
    """Static input buffers, refilled with copy_ in prepare()."""

    def __init__(self, device):
        self.w = torch.randn(8, 8, device=device)
        self.x = torch.zeros(8, device=device)
        self.ids = torch.zeros(2, dtype=torch.long, device=device)
        self.extras = [torch.zeros(8, device=device)]

    def prepare(self, i):
        self.x.copy_(torch.randn(8))
        self.ids.copy_(torch.randint(0, 8, (2,)))
        self.extras[0].copy_(torch.randn(8))

    def step(self):
        h = self.w @ self.x
        rows = self.w.index_select(0, self.ids)
        bias = self.extras[0] * 0.5
        return h + rows.sum(0) + bias


def make(device):
    return Rebinds(device)


def make_clean(device):
    return RebindsClean(device)
