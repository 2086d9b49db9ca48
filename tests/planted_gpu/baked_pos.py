"""Planted: a Python-int position baked into a write (replay writes the captured slot every time)."""

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planted_common import BATCH, D, Target  # noqa: E402


class RingWriter(nn.Module):
    def __init__(self, d: int, slots: int = 8):
        super().__init__()
        self.register_buffer("ring", torch.zeros(slots, BATCH, d))
        self.pos = 0  # host-side position counter

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self.ring[self.pos % self.ring.shape[0]] = h  # PLANT: slot index baked at capture
        self.pos += 1  # HAZARD: cpu-side-effect
        return h + self.ring.mean(0)


def make(device):
    return Target(device, ("writer", RingWriter(D)))
