"""Planted host state kept in numpy arrays and mutated in place by the step (and a graph-safe twin).

The array object stays the same, so only its contents tell that the step changed it; a replay
would run the kernels and leave the lengths where capture left them.
"""

import numpy as np
import torch
from torch import nn


class NumpyState:
    def __init__(self, device):
        self.lin = nn.Linear(8, 8).to(device)
        self.x = torch.zeros(2, 8, device=device)
        self.seq_lens = np.array([5, 7])
        self.slots = np.zeros(64, dtype=np.int64)

    def prepare(self, i):
        self.x.copy_(torch.randn(2, 8))

    @torch.no_grad()
    def step(self):
        y = self.lin(self.x)
        self.seq_lens += 1  # HAZARD: cpu-side-effect
        self.slots[self.seq_lens[0] % 64] = 1  # HAZARD: cpu-side-effect
        return y


class NumpyStateClean(NumpyState):
    """The same bookkeeping in prepare(), outside the graph; the step only runs kernels."""

    def prepare(self, i):
        super().prepare(i)
        self.seq_lens += 1
        self.slots[self.seq_lens[0] % 64] = 1

    @torch.no_grad()
    def step(self):
        return self.lin(self.x)


def make(device):
    return NumpyState(device)


def make_clean(device):
    return NumpyStateClean(device)
