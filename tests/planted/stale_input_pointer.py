"""Planted stale-input-pointer hazards (and a graph-safe twin): inputs rebound by prepare().

The step is fine on its own; the staging is the bug: prepare() makes new tensors each step,
so a replayed graph keeps reading the ones that existed at capture.
"""

import torch


class Rebinds:
    def __init__(self, device):
        self.device = device
        self.w = torch.randn(8, 8, device=device)
        self.pair = [torch.zeros(8, device=device), torch.zeros(8, device=device)]  # double buffering
        self.ring = torch.zeros(4, 8, device=device)
        self.prepare(0)

    def prepare(self, i):
        self.x = torch.randn(8, device=self.device)
        self.ids = torch.randint(0, 8, (2,), device=self.device)
        self.extras = [torch.randn(8, device=self.device)]
        self.staged = self.pair[i % 2]  # persistent buffers, alternated by the host
        self.staged.copy_(torch.randn(8))
        self.slot = self.ring[i % 4]  # one buffer, a host-chosen row
        self.slot.copy_(torch.randn(8))

    def step(self):
        h = self.w @ self.x  # HAZARD: stale-input-pointer
        rows = self.w.index_select(0, self.ids)  # HAZARD: stale-input-pointer
        bias = self.extras[0] * 0.5  # HAZARD: stale-input-pointer
        staged = self.staged * 2  # HAZARD: stale-input-pointer
        slot = self.slot - 1  # HAZARD: stale-input-pointer
        return h + rows.sum(0) + bias + staged + slot


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
        staged = self.extras[0] * 2
        slot = self.x - 1
        return h + rows.sum(0) + bias + staged + slot


def make(device):
    return Rebinds(device)


def make_clean(device):
    return RebindsClean(device)
