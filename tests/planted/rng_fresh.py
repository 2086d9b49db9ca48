"""Planted fresh-entropy reseeding inside the step (and a twin that reseeds outside it).

A sampler that wants nondeterministic draws per token calls `gen.seed()` (a new seed from the OS) on its
own generator, or `torch.cuda.seed_all()`; the same fresh-seed path restores saved states with
`torch.cuda.set_rng_state_all`. A CUDA generator refuses a new seed or state while a graph is being
captured, and a replay would not reseed.
"""

import torch


class Fresh:
    def __init__(self, device):
        self.logits = torch.zeros(2, 12, device=device)
        self.gen = torch.Generator(device=device)
        self.saved = []  # one state per CUDA device (none on a CPU-only machine)

    def prepare(self, i):
        self.logits.copy_(torch.randn(2, 12))

    @torch.no_grad()
    def step(self):
        self.gen.seed()  # HAZARD: rng
        torch.cuda.seed_all()  # HAZARD: rng
        torch.cuda.set_rng_state_all(self.saved)  # HAZARD: rng
        return self.logits.softmax(-1).argmax(-1)


class FreshClean(Fresh):
    """Reseeded in prepare(), outside the graph; the step only reads."""

    def prepare(self, i):
        super().prepare(i)
        self.gen.seed()

    @torch.no_grad()
    def step(self):
        return self.logits.softmax(-1).argmax(-1)


def make(device):
    return Fresh(device)


def make_clean(device):
    return FreshClean(device)
