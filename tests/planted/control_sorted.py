"""Planted host-side ranking (and a graph-safe twin): Python's sorted() over a score tensor compares
0-dim elements on the host, a data-dependent number of times. The sort line is the finding (a read of
device values, and the op sequence it varies); the line after it, which every step runs the same way,
is not.
"""

import torch

N, D, K = 16, 8, 3  # 16 drafts: four steps of random scores share one comparison count with p < 0.01


class Rerank:
    def __init__(self, device):
        self.drafts = torch.zeros(N, D, device=device)
        self.q = torch.randn(D, device=device)

    def prepare(self, i):
        self.drafts.copy_(torch.randn(N, D))

    @torch.no_grad()
    def step(self):
        scores = self.drafts @ self.q
        best = sorted(scores, reverse=True)[:K]  # HAZARD: host-sync, data-dependent-control
        return torch.stack(best)


class RerankClean(Rerank):
    @torch.no_grad()
    def step(self):
        return torch.topk(self.drafts @ self.q, K).values


def make(device):
    return Rerank(device)


def make_clean(device):
    return RerankClean(device)
