"""Planted host choices whose two paths share their first ops (and a graph-safe twin).

Self-speculative decoding alternates a draft pass (one layer) and a verify pass (all layers) through
one helper, called from two arms of a `match` on a host-side phase: both steps start with the same
ops, and the helper's loop then runs another trip count. A sampler table is indexed by the request's
strategy into a local, then called. A graph replays only the captured path.
"""

import torch
from torch import nn

V, D, L = 32, 8, 3
MODES = ["draft", "draft", "verify"]


def _greedy(logits):
    return logits.argmax(-1)


def _tempered(logits):
    return (logits / 0.7).softmax(-1).argmax(-1)


SAMPLERS = {"greedy": _greedy, "tempered": _tempered}


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.layers = nn.ModuleList(nn.Linear(D, D) for _ in range(L))
        self.head = nn.Linear(D, V)

    def run(self, ids, n):
        h = self.emb(ids)
        for layer in self.layers[:n]:
            h = h + torch.relu(layer(h))
        return self.head(h)


class Paths:
    def __init__(self, device):
        self.model = Stack().to(device)
        self.ids = torch.zeros(2, dtype=torch.long, device=device)
        self.phase, self.strategy = "draft", "greedy"

    def prepare(self, i):
        self.ids.copy_(torch.randint(0, V, (2,)))
        self.phase = MODES[i % 3]
        self.strategy = "greedy" if i % 2 else "tempered"

    @torch.no_grad()
    def step(self):
        match self.phase:  # HAZARD: data-dependent-control
            case "draft":
                logits = self.model.run(self.ids, 1)
            case _:
                logits = self.model.run(self.ids, L)
        sample = SAMPLERS[self.strategy]  # HAZARD: data-dependent-control
        return sample(logits)


class PathsClean(Paths):
    """Always the full stack; both samplers computed, the device picks per step."""

    def __init__(self, device):
        super().__init__(device)
        self.greedy = torch.zeros((), dtype=torch.bool, device=device)

    def prepare(self, i):
        super().prepare(i)
        self.greedy.fill_(self.strategy == "greedy")

    @torch.no_grad()
    def step(self):
        logits = self.model.run(self.ids, L)
        return torch.where(self.greedy, _greedy(logits), _tempered(logits))


def make(device):
    return Paths(device)


def make_clean(device):
    return PathsClean(device)
