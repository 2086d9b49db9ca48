"""Planted data-dependent-control hazards (and a graph-safe twin): steps that run different ops.

The data is fresh random every run, but built so that each branch really flips between steps
(signs alternate, the loop count cycles), so the hazard shows in every scan.
"""

import torch


class Control:
    def __init__(self, device):
        self.x = torch.zeros(8, device=device)
        self.k = torch.zeros(3, dtype=torch.long, device=device)
        self.calls = 0

    def prepare(self, i):
        self.x.copy_(torch.rand(8) * (1 if i % 2 else -1))
        ks = torch.zeros(3, dtype=torch.long)
        ks[: i % 3 + 1] = 1
        self.k.copy_(ks[torch.randperm(3)])

    def step(self):
        y = self.x
        if y.sum() > 0:  # HAZARD: data-dependent-control, host-sync
            y = y * 2
        else:
            y = y - 1
        y = torch.tanh(y)
        self.calls += 1  # HAZARD: cpu-side-effect
        if self.calls % 3 == 0:  # HAZARD: data-dependent-control
            y = y.exp()
        y = torch.sigmoid(y)
        for _ in range(int(self.k.sum())):  # HAZARD: data-dependent-control, host-sync
            y = y * 0.5 + 1
        return y.sum()


class ControlClean:
    """Both sides computed and selected on the device; the counter lives on the device;
    the loop runs its static maximum and masks the iterations that should not count."""

    def __init__(self, device):
        self.x = torch.zeros(8, device=device)
        self.k = torch.zeros(3, dtype=torch.long, device=device)
        self.calls = torch.zeros((), dtype=torch.long, device=device)

    prepare = Control.prepare

    def step(self):
        y = self.x
        y = torch.where(y.sum() > 0, y * 2, y - 1)
        y = torch.tanh(y)
        self.calls.add_(1)
        y = torch.where(self.calls % 3 == 0, y.exp(), y)
        y = torch.sigmoid(y)
        n = self.k.sum()
        for j in range(3):
            y = torch.where(j < n, y * 0.5 + 1, y)
        return y.sum()


def make(device):
    return Control(device)


def make_clean(device):
    return ControlClean(device)
