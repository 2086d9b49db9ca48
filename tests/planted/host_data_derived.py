"""Planted host data that passes through torch helpers on the host before it is sent to the device
(and a twin that stages it in prepare()).

Block tables padded with pad_sequence from per-sequence `torch.tensor` rows, candidate ids stacked from
host rows, a numpy mask widened with `.long()`: each result is still pageable host memory, so its
`.to(device)` in the step is a host-to-device copy that capture refuses.
"""

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

D, NB = 8, 16


class Derived:
    def __init__(self, device):
        self.device = device
        self.pool = torch.randn(NB, D, device=device)
        self.rows = [[0, 1], [2]]
        self.cands = [[3, 4], [5, 6]]
        self.ban = np.zeros(NB, dtype=bool)

    def prepare(self, i):
        self.rows = [[i % NB, (i + 1) % NB], [(i + 2) % NB]]
        self.cands = [[(i + 3) % NB, 4], [5, (i + 6) % NB]]
        self.ban[:] = False
        self.ban[i % NB] = True

    @torch.no_grad()
    def step(self):
        table = pad_sequence([torch.tensor(r) for r in self.rows], batch_first=True, padding_value=0)  # HAZARD: baked-host-value
        table = table.to(self.device, non_blocking=True)  # HAZARD: pageable-copy
        cands = torch.stack([torch.tensor(c) for c in self.cands])  # HAZARD: baked-host-value
        cands = cands.to(self.device)  # HAZARD: pageable-copy
        ban = torch.from_numpy(self.ban).long()  # HAZARD: baked-host-value
        ban = ban.to(self.device)  # HAZARD: pageable-copy
        return self.pool[table].sum(1) + self.pool[cands].sum(1) - ban.sum()


class DerivedClean(Derived):
    """The tables are padded on the host in prepare() and copied into persistent device tensors."""

    def __init__(self, device):
        super().__init__(device)
        self.table = torch.zeros(2, 2, dtype=torch.long, device=device)
        self.cand = torch.zeros(2, 2, dtype=torch.long, device=device)
        self.banned = torch.zeros(NB, dtype=torch.long, device=device)

    def prepare(self, i):
        super().prepare(i)
        self.table.copy_(pad_sequence([torch.tensor(r) for r in self.rows], batch_first=True, padding_value=0))
        self.cand.copy_(torch.stack([torch.tensor(c) for c in self.cands]))
        self.banned.copy_(torch.from_numpy(self.ban).long())

    @torch.no_grad()
    def step(self):
        return self.pool[self.table].sum(1) + self.pool[self.cand].sum(1) - self.banned.sum()


def make(device):
    return Derived(device)


def make_clean(device):
    return DerivedClean(device)
