"""Planted host-side expert dispatch whose experts branch internally (and a graph-safe twin).

Which expert runs changes between steps; each expert's forward goes through a helper with an
`if` that every call takes the same way. The decision is the dispatch loop's guard, never the
helper's `if` (the steps differ only in the module instance that ran there).
"""

import torch
from torch import nn

E = 4


def project(lin, x):
    packed = getattr(lin, "packed", None)
    if packed is None:  # every call takes this side: not a decision
        return lin(x)
    return x @ packed


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        return project(self.w2, project(self.w1, x).relu())


class Dispatch:
    def __init__(self, device):
        self.experts = nn.ModuleList(Expert() for _ in range(E)).to(device)
        self.x = torch.zeros(2, 8, device=device)
        self.sel = torch.zeros(2, dtype=torch.long, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(2, 8))
        self.sel.copy_(torch.randperm(E)[:2] if i % 2 else torch.randperm(E)[:1].repeat(2))

    @torch.no_grad()
    def step(self):
        counts = torch.bincount(self.sel, minlength=E).tolist()  # HAZARD: host-sync
        y = torch.zeros_like(self.x)
        for e in range(E):
            if counts[e] == 0:  # HAZARD: data-dependent-control
                continue
            y = y + self.experts[e](self.x) * (self.sel == e)[:, None]  # the loop index: fine once the guard goes
        return torch.tanh(y)


class DispatchClean(Dispatch):
    @torch.no_grad()
    def step(self):
        y = torch.zeros_like(self.x)
        for e in range(E):
            y = y + self.experts[e](self.x) * (self.sel == e)[:, None]
        return torch.tanh(y)


def make(device):
    return Dispatch(device)


def make_clean(device):
    return DispatchClean(device)
