"""Planted host tensors made by a dataclass field's default_factory, moved to the device in the step
(and a twin that stages them into device buffers in prepare()).

`field(default_factory=lambda: torch.ones(1))` names no device: every instance gets a tensor in pageable
host memory, made where the class declares the field, not in `__init__`. `.to(device)` of it in the step
is a pageable host-to-device copy on a GPU, and capture raises on it.
"""

from dataclasses import dataclass, field

import torch

@dataclass
class Sampling:
    temperature: torch.Tensor = field(default_factory=lambda: torch.ones(1))
    bias: torch.Tensor = field(default_factory=lambda: torch.zeros(8, dtype=torch.float32))
    top_k: int = 4


class Engine:
    def __init__(self, device):
        self.device = torch.device(device)
        self.x = torch.zeros(8, device=device)
        self.s = Sampling()

    def prepare(self, i):
        self.x.copy_(torch.randn(8))
        self.s.temperature.fill_(0.5 + 0.1 * (i % 3))

    @torch.no_grad()
    def step(self):
        t = self.s.temperature.to(self.device, non_blocking=True)  # HAZARD: pageable-copy
        b = self.s.bias.to(self.device)  # HAZARD: pageable-copy
        return torch.topk((self.x + b) / t, self.s.top_k).values


class EngineClean(Engine):
    """The host fields are staged into device buffers in prepare(), outside the graph."""

    def __init__(self, device):
        super().__init__(device)
        self.t_dev = torch.ones(1, device=device)
        self.b_dev = torch.zeros(8, device=device)

    def prepare(self, i):
        super().prepare(i)
        self.t_dev.copy_(self.s.temperature.to(self.device))
        self.b_dev.copy_(self.s.bias.to(self.device))

    @torch.no_grad()
    def step(self):
        return torch.topk((self.x + self.b_dev) / self.t_dev, self.s.top_k).values


def make(device):
    return Engine(device)


def make_clean(device):
    return EngineClean(device)
