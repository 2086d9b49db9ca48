"""Planted Python state held where a snapshot of the target's attributes does not look (and a twin).

A logits processor bound with functools.partial keeps a running dict among its frozen arguments; a
caching descriptor on the model's class counts its hits on itself (a class attribute, not the
instance); a module-level registry maps names to metric objects, and the step bumps one. A replay
would do none of it.
"""

import functools

import torch
from torch import nn

V, D = 32, 8


def penalty(logits, *, state, scale=0.9):
    state["applied"] += 1  # HAZARD: cpu-side-effect
    return logits * scale


class CachedBias:
    """Non-data descriptor: the bias is built once per instance; hits are counted on the descriptor."""

    def __init__(self):
        self.hits = 0

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        if "_bias" not in obj.__dict__:
            obj.__dict__["_bias"] = torch.zeros(V, device=obj.head.weight.device)
        self.hits += 1  # HAZARD: cpu-side-effect
        return obj.__dict__["_bias"]


class Meter:
    def __init__(self):
        self.calls = 0


METERS = {"decode.head": Meter()}


class Head(nn.Module):
    bias = CachedBias()

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.head = nn.Linear(D, V)

    def forward(self, ids):
        METERS["decode.head"].calls += 1  # HAZARD: cpu-side-effect
        return self.head(self.emb(ids)) + self.bias


class Bound:
    def __init__(self, device):
        self.model = Head().to(device)
        self.ids = torch.zeros(2, dtype=torch.long, device=device)
        self.processors = [functools.partial(penalty, state={"applied": 0}), functools.partial(penalty, scale=1.0,
                                                                                              state={"applied": 0})]

    def prepare(self, i):
        self.ids.copy_(torch.randint(0, V, (2,)))

    @torch.no_grad()
    def step(self):
        logits = self.model(self.ids)
        logits = self.processors[0](logits)
        return logits.argmax(-1)


def stateless(logits, *, scale):
    return logits * scale


class CleanHead(nn.Module):
    def __init__(self, device):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.head = nn.Linear(D, V)
        self.register_buffer("bias", torch.zeros(V))

    def forward(self, ids):
        return self.head(self.emb(ids)) + self.bias


class BoundClean(Bound):
    """Partials with constant arguments; the bias is a buffer; metering happens in prepare()."""

    def __init__(self, device):
        super().__init__(device)
        self.model = CleanHead(device).to(device)
        self.processors = [functools.partial(stateless, scale=0.9)]

    def prepare(self, i):
        super().prepare(i)
        METERS["decode.head"].calls += 1

    @torch.no_grad()
    def step(self):
        return self.processors[0](self.model(self.ids)).argmax(-1)


def make(device):
    return Bound(device)


def make_clean(device):
    return BoundClean(device)
