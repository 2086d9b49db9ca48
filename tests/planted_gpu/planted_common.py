"""A small layered model for planted capture hazards: three layers, one hazard module in layer 1.

Each planted file builds `Target(device, plant=(name, module))`: the hazard sits at
`model.layers.1.<name>`, which is the leaf bisection must name. Everything else is graph-safe:
inputs are staged into a static buffer in prepare(), the step only reads it.
"""

from __future__ import annotations

import torch
from torch import nn

D = 64      # width of the toy model
BATCH = 2


class Mix(nn.Module):
    """A clean leaf: linear + tanh."""

    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class Layer(nn.Module):
    def __init__(self, d: int, plant: tuple[str, nn.Module] | None = None):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mix = Mix(d)
        self.plant_name = None
        if plant is not None:
            self.plant_name = plant[0]
            self.add_module(plant[0], plant[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.mix(self.norm(x))
        if self.plant_name is not None:
            h = getattr(self, self.plant_name)(h)
        return x + h


class Net(nn.Module):
    def __init__(self, d: int, n_layers: int, plant_layer: int, plant):
        super().__init__()
        self.layers = nn.ModuleList(Layer(d, plant if i == plant_layer else None) for i in range(n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Target:
    """prepare(i): fresh input copied into the static buffer; step(): the model on that buffer."""

    def __init__(self, device, plant: tuple[str, nn.Module] | None, n_layers: int = 3, plant_layer: int = 1,
                 seed: int = 0):
        torch.manual_seed(seed)
        self.device = torch.device(device)
        self.model = Net(D, n_layers, plant_layer, plant).to(self.device).eval()
        self.x = torch.zeros(BATCH, D, device=self.device)
        self.gen = torch.Generator().manual_seed(seed)

    def prepare(self, i: int) -> None:
        self.x.copy_(torch.randn(BATCH, D, generator=self.gen))

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        return self.model(self.x)


def marker_line(path: str, marker: str = "# PLANT") -> int:
    """Line number of the planted hazard (tests compare findings against it)."""
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if marker in line:
                return i
    raise ValueError(f"no {marker!r} in {path}")
