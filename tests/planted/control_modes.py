"""Planted mixed precision switched by a host flag (and a graph-safe twin): the same lines run every
step, but `torch.autocast(..., enabled=flag)` decides which ops (casts) they dispatch, so a graph
keeps the precision of the captured step. The finding belongs on the `with`, not on an op inside it.
"""

import torch
from torch import nn

D, V = 16, 32


class ModeSwitch:
    def __init__(self, device, flip=True):
        self.device = device
        self.ff = nn.Linear(D, D).to(device)
        self.head = nn.Linear(D, V).to(device)
        self.x = torch.zeros(2, D, device=device)
        self.flip = flip
        self.low_precision = False

    def prepare(self, i):
        self.x.copy_(torch.randn(2, D))
        self.low_precision = self.flip and i % 2 == 1  # a fallback the scheduler toggles

    @torch.no_grad()
    def step(self):
        kind = torch.device(self.device).type
        with torch.autocast(kind, dtype=torch.bfloat16, enabled=self.low_precision):  # HAZARD: data-dependent-control
            return self.head(torch.relu(self.ff(self.x)))


def make(device):
    return ModeSwitch(device)


def make_clean(device):
    return ModeSwitch(device, flip=False)  # the flag never changes: one op sequence
