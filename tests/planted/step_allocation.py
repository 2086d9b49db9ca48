"""Planted escaping allocations (and a graph-safe twin): state rebound to tensors made in the step.

Allocating inside a captured step is legal (info); these are the silent ones: the new tensor
becomes state that the next step reads, which a replay never updates.
"""

import torch


class Escapes:
    def __init__(self, device):
        self.x = torch.zeros(4, device=device)
        self.state = torch.zeros(4, device=device)
        self.window = torch.zeros(3, 4, device=device)
        self.slots = {"h": torch.zeros(4, device=device)}
        self.last = torch.zeros(4, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(4))

    def step(self):
        self.state = self.state * 0.9 + self.x  # HAZARD: step-allocation
        self.window = torch.cat([self.window[1:], self.x[None]])  # HAZARD: step-allocation
        self.slots["h"] = torch.tanh(self.slots["h"] + self.state)  # HAZARD: step-allocation
        delta = self.x - self.last
        self.last = self.x.clone()  # HAZARD: step-allocation
        return self.state + self.window.sum(0) + self.slots["h"] + delta


class EscapesClean:
    """The same recurrences, updated in place in preallocated buffers."""

    def __init__(self, device):
        self.x = torch.zeros(4, device=device)
        self.state = torch.zeros(4, device=device)
        self.window = torch.zeros(3, 4, device=device)
        self.slots = {"h": torch.zeros(4, device=device)}
        self.last = torch.zeros(4, device=device)

    prepare = Escapes.prepare

    def step(self):
        self.state.mul_(0.9).add_(self.x)
        self.window.copy_(torch.cat([self.window[1:], self.x[None]]))
        self.slots["h"].copy_(torch.tanh(self.slots["h"] + self.state))
        delta = self.x - self.last
        self.last.copy_(self.x)
        return self.state + self.window.sum(0) + self.slots["h"] + delta


def make(device):
    return Escapes(device)


def make_clean(device):
    return EscapesClean(device)
