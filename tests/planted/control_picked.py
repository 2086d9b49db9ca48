"""Planted module choice by a device value (and a graph-safe twin): a Python list of per-bucket heads
indexed by a 0-dim device tensor. The index is read on the host (`__index__`), and the module called
on the next line differs from step to step: the decision is the line that picked it, not the call.
"""

import torch
from torch import nn

D, NB = 8, 3


class Picked:
    def __init__(self, device):
        self.heads = [nn.Linear(D, D).to(device) for _ in range(NB)]
        self.bucket = torch.zeros((), dtype=torch.long, device=device)
        self.x = torch.zeros(D, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(D))
        self.bucket.fill_(i % NB)

    @torch.no_grad()
    def step(self):
        head = self.heads[self.bucket]  # HAZARD: host-sync, data-dependent-control
        return torch.tanh(head(self.x))


class PickedClean(Picked):
    """Every head's weights stacked once; the step gathers the chosen one on the device."""

    def __init__(self, device):
        super().__init__(device)
        self.w = torch.stack([h.weight.detach() for h in self.heads])
        self.b = torch.stack([h.bias.detach() for h in self.heads])

    @torch.no_grad()
    def step(self):
        w, b = self.w.index_select(0, self.bucket.reshape(1))[0], self.b.index_select(0, self.bucket.reshape(1))[0]
        return torch.tanh(w @ self.x + b)


def make(device):
    return Picked(device)


def make_clean(device):
    return PickedClean(device)
