"""Planted: a pageable host->device copy inside layer 1 (capture raises "unless the CPU tensor is pinned")."""

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planted_common import D, Target  # noqa: E402


class HostBias(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.host = torch.linspace(-1.0, 1.0, d)  # a plain CPU tensor: not a buffer, not pinned

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.host.to(h.device)  # PLANT: pageable copy in the step


def make(device):
    return Target(device, ("bias", HostBias(D)))
