"""Planted rng hazards (and a graph-safe twin): random numbers drawn inside the step."""

import torch
import torch.nn.functional as F


class Random:
    def __init__(self, device):
        self.x = torch.zeros(8, device=device)
        self.probs = torch.zeros(8, device=device)
        self.gen = torch.Generator(device=device).manual_seed(1234)

    def prepare(self, i):
        self.x.copy_(torch.randn(8))
        self.probs.copy_(torch.rand(8) + 0.1)

    def step(self):
        noise = torch.randn(8, device=self.x.device)  # HAZARD: rng
        dropped = F.dropout(self.x, p=0.25, training=True)  # HAZARD: rng
        token = torch.multinomial(self.probs, 1)  # HAZARD: rng
        coin = torch.bernoulli(self.probs / self.probs.sum())  # HAZARD: rng
        jitter = torch.rand(8, generator=self.gen, device=self.x.device)  # HAZARD: rng
        return noise + dropped + token + coin + jitter


class RandomClean:
    """Randomness is drawn in prepare() (outside the graph) into static buffers."""

    def __init__(self, device):
        self.x = torch.zeros(8, device=device)
        self.noise = torch.zeros(8, device=device)
        self.keep = torch.zeros(8, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(8))
        self.noise.copy_(torch.randn(8))
        self.keep.copy_(torch.bernoulli(torch.full((8,), 0.75)))

    def step(self):
        return self.noise + self.x * self.keep / 0.75


def make(device):
    return Random(device)


def make_clean(device):
    return RandomClean(device)
