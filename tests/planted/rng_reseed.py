"""Planted reseeding inside the step (and a graph-safe twin).

Per-request reproducible sampling often reseeds right before drawing: the global generators, or a
request's own generator object. A CUDA generator refuses a new seed while a graph is being
captured, and a replay would not reseed anyway.
"""

import torch


class Reseed:
    def __init__(self, device):
        self.probs = torch.zeros(2, 10, device=device)
        self.seed = 0
        self.gen = torch.Generator(device=device)

    def prepare(self, i):
        self.probs.copy_(torch.rand(2, 10))
        self.seed = int(torch.randint(0, 2**31, ()))

    @torch.no_grad()
    def step(self):
        torch.manual_seed(self.seed)  # HAZARD: rng
        first = torch.multinomial(self.probs, 1)
        torch.cuda.manual_seed_all(self.seed + 1)  # HAZARD: rng
        state = torch.get_rng_state()
        second = torch.multinomial(self.probs, 1)
        torch.set_rng_state(state)  # HAZARD: rng
        self.gen.manual_seed(self.seed + 2)  # HAZARD: rng
        third = torch.multinomial(self.probs, 1, generator=self.gen)  # HAZARD: rng
        return first, second, third


class ReseedClean(Reseed):
    """The noise is drawn in prepare() from a per-request generator, into a static buffer."""

    def __init__(self, device):
        super().__init__(device)
        self.noise = torch.zeros(2, 10, device=device)

    def prepare(self, i):
        super().prepare(i)
        g = torch.Generator().manual_seed(self.seed)
        self.noise.copy_(torch.rand(2, 10, generator=g))

    @torch.no_grad()
    def step(self):
        return (self.probs.log() - (-self.noise.clamp_min(1e-9).log()).log()).argmax(-1)


def make(device):
    return Reseed(device)


def make_clean(device):
    return ReseedClean(device)
