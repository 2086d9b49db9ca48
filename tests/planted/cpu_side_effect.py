"""Planted cpu-side-effect hazards (and a graph-safe twin): Python state the step changes."""

import itertools

import torch
from torch import nn

_CALLS = 0


class Meta:
    def __init__(self):
        self.tokens = 0


class SideEffects(nn.Module):
    total_steps = 0  # a class attribute: shared state of every instance

    def __init__(self, device):
        super().__init__()
        self.proj = nn.Linear(8, 8, device=device)
        self.x = torch.zeros(8, device=device)
        self.counter = 0
        self.history = []
        self.stats = {"steps": 0}
        self.phase = 0
        self.meta = Meta()
        self.request_ids = itertools.count()

    def prepare(self, i):
        self.x.copy_(torch.randn(8))

    @torch.no_grad()
    def step(self):
        global _CALLS
        y = self.proj(self.x)
        self.counter += 1  # HAZARD: cpu-side-effect
        self.history.append(y)  # HAZARD: cpu-side-effect
        self.stats["steps"] = self.stats["steps"] + 1  # HAZARD: cpu-side-effect
        setattr(self, "phase", self.phase + 1)  # HAZARD: cpu-side-effect  # noqa: B010
        self.meta.tokens += 1  # HAZARD: cpu-side-effect
        _CALLS += 1  # HAZARD: cpu-side-effect
        SideEffects.total_steps += 1  # HAZARD: cpu-side-effect
        next(self.request_ids)  # HAZARD: cpu-side-effect
        return torch.relu(y)


class SideEffectsClean(nn.Module):
    """State that must advance every step lives on the device and is updated in place."""

    def __init__(self, device):
        super().__init__()
        self.proj = nn.Linear(8, 8, device=device)
        self.x = torch.zeros(8, device=device)
        self.register_buffer("counter", torch.zeros((), dtype=torch.long, device=device))
        self.register_buffer("history", torch.zeros(16, 8, device=device))

    prepare = SideEffects.prepare

    @torch.no_grad()
    def step(self):
        y = self.proj(self.x)
        self.history.index_copy_(0, (self.counter % 16).reshape(1), y[None])
        self.counter.add_(1)
        return torch.relu(y)


def make(device):
    return SideEffects(device)


def make_clean(device):
    return SideEffectsClean(device)


def make_closure(device):
    """A target class defined inside its factory, counting in a closure cell."""
    x = torch.zeros(8, device=device)
    served = 0

    class Served:
        def prepare(self, i):
            x.copy_(torch.randn(8))

        def step(self):
            nonlocal served
            served += 1  # CLOSURE-HAZARD (tests/test_audit_planted.py scans make_closure for it)
            return x * 2

    return Served()
