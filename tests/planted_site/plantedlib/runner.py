"""The package's own decode loop: a `plantedlib.runner:make` target (installed code, no wrapper file)."""

import torch

from plantedlib import kv, numerics


class Runner:
    def __init__(self, device):
        self.x = torch.zeros(8, device=device)
        self.cache = kv.GrowingCache(8, device)

    def prepare(self, i):
        self.x.copy_(torch.randn(8))

    def step(self):
        self.cache.append(self.x)
        return numerics.normalize(self.x)


def make(device):
    return Runner(device)
