"""A counter kept by an element of a library object's list is reported at the target's call of its method.

fla's `Cache` keeps one `FLALayer` per layer in its own `layers` list; each `update()` adds the new tokens to
the layer's Python `_seen_tokens`. The target's layer calls `past_key_values.update(...)`, and the target itself
loops over its own `self.layers` of modules. The caller search for an element of a container matched the
container by its attribute name alone, so `cache.layers.0`'s counter was put at the target's `for layer in
self.layers: h = layer(h, self.cache)` line (another object's `layers`) instead of the `update` call.
"""

from __future__ import annotations

import random

from site_util import blocking, install_library, library_hit, write_target

LIB = """
class Layer:
    def __init__(self):
        self.state = None
        self.seen = 0

    def update(self, state, offset=1):
        self.state = state
        self.seen += offset  # LIBSITE
        return self.state


class Cache:
    def __init__(self):
        self.layers = []

    def update(self, state, layer_idx, offset=1):
        while len(self.layers) <= layer_idx:
            self.layers.append(Layer())
        return self.layers[layer_idx].update(state, offset)

    def __getitem__(self, i):
        return self.layers[i].state
"""

TARGET = """
import torch
from torch import nn
from {mod} import Cache

D, L = {d}, {n}


class Mixer(nn.Module):
    def __init__(self, idx):
        super().__init__()
        self.idx = idx
        self.proj = nn.Linear(D, D)

    def forward(self, x, past_key_values):
        state = past_key_values[self.idx]
        state.mul_(0.5).add_(self.proj(x))
        past_key_values.update(state, layer_idx=self.idx, offset=1)  # SITE
        return state


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.layers = nn.ModuleList([Mixer(i) for i in range(L)])
        self.cache = Cache()
        for i in range(L):
            self.cache.update(torch.zeros(1, D), layer_idx=i, offset=0)
        self.x = torch.zeros(1, D)

    def prepare(self, i):
        self.x.normal_()

    @torch.no_grad()
    def step(self):
        h = self.x
        for layer in self.layers:
            h = h + layer(h, self.cache)
        return h


def make(device):
    return Target()
"""


def test_a_library_containers_element_counter_names_the_method_call(tmp_path, monkeypatch):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="flacache")
    path, line = write_target(tmp_path / "target" / "cache_layers.py", TARGET, mod=mod, d=random.choice([8, 16]),
                              n=random.choice([2, 3]), seed=random.randrange(2**31))
    bad = blocking(path, forget=mod)
    library_hit(bad[bad.category == "cpu-side-effect"], "cpu-side-effect", lib, path, line)
