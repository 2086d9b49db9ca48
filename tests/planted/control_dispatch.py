"""Planted host-side expert dispatch with no expert modules (and a graph-safe twin).

One loop over expert ids; an expert that got no token is skipped by a guard, and a different one
each step. The alignment of the two steps' ops then cuts across loop iterations, but the decision
is the guard's: the `for` line, whose trip count never changes, must not be blamed.
"""

import torch

T, D, E = 6, 8, 4


class Dispatch:
    def __init__(self, device):
        self.x = torch.zeros(T, D, device=device)
        self.route = torch.zeros(T, dtype=torch.long, device=device)
        self.scale = torch.rand(E, 1, device=device) + 0.5

    def prepare(self, i):
        self.x.copy_(torch.randn(T, D))
        skip = int(torch.randint(0, E, ())) if i % 2 else (i // 2) % E  # a different idle expert each step
        others = [e for e in range(E) if e != skip]
        self.route.copy_(torch.tensor([others[int(j)] for j in torch.randint(0, E - 1, (T,))]))

    @torch.no_grad()
    def step(self):
        out = torch.zeros_like(self.x)
        for e in range(E):
            idx = (self.route == e).nonzero().squeeze(-1)  # HAZARD: host-sync, dynamic-shape
            if idx.numel() == 0:  # HAZARD: data-dependent-control
                continue
            out.index_add_(0, idx, self.x.index_select(0, idx) * 2.0)
        return out * self.scale.sum()


class DispatchClean(Dispatch):
    @torch.no_grad()
    def step(self):
        out = torch.zeros_like(self.x)
        for e in range(E):
            out = out + self.x * 2.0 * (self.route == e)[:, None]
        return out * self.scale.sum()


def make(device):
    return Dispatch(device)


def make_clean(device):
    return DispatchClean(device)
