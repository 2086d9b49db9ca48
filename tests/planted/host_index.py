"""Planted host index tensors into device tensors (and a twin whose indices live on the device).

Advanced indexing of a device tensor by a host index tensor (`pool[torch.tensor([0, 2])]`, a row range from
`torch.arange(n)` naming no device) first copies the index from pageable host memory to the device, inside
the op: capture raises on that copy, and eager decode waits for it.
"""

import torch

D, NB = 8, 16


class HostIndex:
    def __init__(self, device):
        self.pool = torch.randn(NB, D, device=device)
        self.out = torch.zeros(D, device=device)

    def prepare(self, i):
        self.pool[i % NB].add_(1.0)

    @torch.no_grad()
    def step(self):
        picked = self.pool[torch.tensor([0, 2, 5])]  # HAZARD: pageable-copy
        rows = torch.arange(4)
        head = self.pool[rows]  # HAZARD: pageable-copy
        self.out.copy_(picked.sum(0) + head.sum(0))
        return self.out


class HostIndexClean(HostIndex):
    """The same rows, indexed by tensors made once on the device."""

    def __init__(self, device):
        super().__init__(device)
        self.picks = torch.tensor([0, 2, 5], device=device)
        self.rows = torch.arange(4, device=device)

    @torch.no_grad()
    def step(self):
        self.out.copy_(self.pool[self.picks].sum(0) + self.pool[self.rows].sum(0))
        return self.out


def make(device):
    return HostIndex(device)


def make_clean(device):
    return HostIndexClean(device)
