"""Key/value caches: one that grows with torch.cat (the hazard), one preallocated (graph-safe)."""

import torch


class GrowingCache:
    def __init__(self, width: int, device):
        self.keys = torch.zeros(0, width, device=device)
        self.length = 0

    def append(self, k):
        self.keys = torch.cat([self.keys, k[None]])  # HAZARD: dynamic-shape, step-allocation
        self.length += 1  # HAZARD: cpu-side-effect
        return self.keys


class StaticCache:
    """Written in place at a device position; attention reads the whole buffer with a mask."""

    def __init__(self, width: int, device, max_len: int = 64):
        self.keys = torch.zeros(max_len, width, device=device)
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        self.idx = torch.arange(max_len, device=device)

    def append(self, k):
        self.keys.index_copy_(0, self.pos.reshape(1), k[None])
        self.pos.add_(1)
        return torch.where((self.idx < self.pos)[:, None], self.keys, 0.0)
