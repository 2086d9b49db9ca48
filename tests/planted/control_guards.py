"""Planted guard clauses (and a graph-safe twin): the branch that decides holds none of the ops.

`if ...: continue`, `... break`, `... return` skip the lines after them, so the ops that differ
between steps sit below the guard, not inside it. The finding must name the guard. The data is
fresh random every run but built so each guard flips between the audited steps.
"""

import torch
from torch import nn

E, K = 4, 4


def soften(h, strength):
    if strength == 0:  # HAZARD: data-dependent-control
        return h
    return h * (1 - strength) + h.tanh() * strength  # HAZARD: baked-host-value


class Guards(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(E))
        self.head = nn.Linear(8, 6)

    def route(self, x, sel):
        out = torch.zeros_like(x)
        for e in range(E):
            hit = sel == e
            if e not in self.active:  # HAZARD: data-dependent-control
                continue
            out = out + self.experts[e](x) * hit[:, None]
        return out

    def verify(self, h, draft, stop_at):
        acc = torch.zeros(h.shape[0], 6, device=h.device)
        for j in range(K):
            if j == stop_at:  # HAZARD: data-dependent-control
                break
            acc = acc + self.head(h) * (draft == j)[:, None]
        return acc


class Control:
    def __init__(self, device):
        self.m = Guards().to(device)
        self.x = torch.zeros(2, 8, device=device)
        self.sel = torch.zeros(2, dtype=torch.long, device=device)
        self.draft = torch.zeros(2, dtype=torch.long, device=device)
        self.strength, self.stop_at = 0.0, 0

    def prepare(self, i):
        self.x.copy_(torch.randn(2, 8))
        self.sel.copy_(torch.randint(0, E, (2,)))
        self.draft.copy_(torch.randint(0, K, (2,)))
        self.m.active = {int(e) for e in torch.randperm(E)[: 1 + i % 2]}
        self.strength = (i % 2) * float(torch.rand(()))
        self.stop_at = 1 + i % 3

    @torch.no_grad()
    def step(self):
        h = self.m.route(self.x, self.sel)
        h = torch.nn.functional.layer_norm(h, (8,))  # ops both steps run keep the regions apart
        h = soften(h, self.strength)
        h = torch.nn.functional.layer_norm(h, (8,))
        return self.m.verify(h, self.draft, self.stop_at)


class ControlClean(Control):
    """Every expert runs and is masked, the verify loop runs K times with a device mask, the
    softening is always applied with a device strength."""

    def __init__(self, device):
        super().__init__(device)
        self.active_mask = torch.zeros(E, device=device)
        self.strength_t = torch.zeros((), device=device)
        self.stop_t = torch.zeros((), dtype=torch.long, device=device)

    def prepare(self, i):
        super().prepare(i)
        self.active_mask.zero_()
        self.active_mask[list(self.m.active)] = 1
        self.strength_t.fill_(self.strength)
        self.stop_t.fill_(self.stop_at)

    @torch.no_grad()
    def step(self):
        out = torch.zeros_like(self.x)
        for e in range(E):
            w = (self.sel == e) * self.active_mask[e]
            out = out + self.m.experts[e](self.x) * w[:, None]
        h = out * (1 - self.strength_t) + out.tanh() * self.strength_t
        acc = torch.zeros(h.shape[0], 6, device=h.device)
        for j in range(K):
            acc = acc + self.m.head(h) * ((self.draft == j) & (j < self.stop_t))[:, None]
        return acc


def make(device):
    return Control(device)


def make_clean(device):
    return ControlClean(device)
