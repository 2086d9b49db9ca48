"""Planted (needs 2 GPUs): a multi-device step that copies between cuda:0 and cuda:1 inside the step.

Layer 1 sends its activations to a helper on the other GPU and brings the result back, inside the
region a graph would capture. A graph belongs to one device and one capturing stream: the copies
and the far GPU's kernels are not in a graph captured on cuda:0 (empty or stale replay there).
dsv4's CUDAGraphDecoder avoids exactly this: one graph per device segment, copies between
segments outside every graph. Both the scan (cross-device) and bisect should name `model.layers.1.hop`.
"""

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planted_common import D, Mix, Target  # noqa: E402


class Hop(nn.Module):
    """Half of the layer's work runs on the other GPU."""

    def __init__(self, d: int, far: str):
        super().__init__()
        self.far_device = torch.device(far)
        self.far = Mix(d).to(self.far_device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        y = self.far(h.to(self.far_device))  # PLANT: cross-device copy inside the step
        return h + y.to(h.device)  # and back: a second cross-device copy


def make(device):
    near = torch.device(device)
    far = "cuda:1" if near.index in (None, 0) else "cuda:0"
    t = Target(device, None)
    t.model.layers[1].add_module("hop", Hop(D, far))  # after Target moved its model to `device`
    t.model.layers[1].plant_name = "hop"
    return t
