"""Planted: `.item()` inside layer 1 (host-sync -> capture fails, sync-during-capture)."""

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planted_common import Target  # noqa: E402


class Gate(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        scale = h.abs().amax().item()  # PLANT: device value read on the host
        return h / (1.0 + scale)  # HAZARD: baked-host-value


def make(device):
    return Target(device, ("gate", Gate()))
