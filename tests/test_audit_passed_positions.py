"""dynamic-shape at every cache slice cut to a host position that comes down through parameters.

Eager reference decoders call `model(tokens, pos)` with a Python int and hand `pos` down through a model's
layers (`layer(h, pos)`, a module called through `__call__`) to an attention that reads `n = x.size(1)` and cuts
its key and value caches with `[:, :pos + n]`. The second slice's length equals the first's in every step, but
it is no size read off the first: it moves with the position, and fixing the first slice leaves it moving. So
each slice is an origin. A value slice cut to the key slice's own length (`[:, :k.size(1)]`) follows it and is
not, and a fixed-size cache read with a device-position mask has no finding at all.
"""

from __future__ import annotations

import random

from site_util import blocking, marked_line, table, write_target

HAZARD = """
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear({d}, 3 * {d})
        self.register_buffer("k", torch.zeros(1, {cap}, {d}))
        self.register_buffer("v", torch.zeros(1, {cap}, {d}))

    def forward(self, x, pos):
        n = x.size(1)
        q, k, v = self.qkv(x).chunk(3, -1)
        self.k[:, pos:pos + n] = k
        self.v[:, pos:pos + n] = v
        keys = self.k[:, :pos + n]  # SITE
        vals = {vals}  # VALS
        return torch.softmax(q @ keys.transpose(1, 2), -1) @ vals


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn()

    def forward(self, h, pos):
        return h + self.attn(h, pos)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range({layers}))

    def forward(self, x, start):
        for layer in self.layers:
            x = layer(x, start)
        return x


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.net = Net()
        self.x = torch.zeros(1, 1, {d})

    def prepare(self, i):
        self.pos = {prompt} + i
        self.x.copy_(torch.randn(1, 1, {d}))

    @torch.no_grad()
    def step(self):
        return self.net(self.x, self.pos)


def make(device):
    return Target()
"""

CLEAN = """
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear({d}, 3 * {d})
        self.register_buffer("k", torch.zeros(1, {cap}, {d}))
        self.register_buffer("v", torch.zeros(1, {cap}, {d}))

    def forward(self, x, pos):
        q, k, v = self.qkv(x).chunk(3, -1)
        self.k.index_copy_(1, pos, k)
        self.v.index_copy_(1, pos, v)
        keep = torch.arange({cap}) <= pos  # SITE
        s = (q @ self.k.transpose(1, 2)).masked_fill(~keep, float("-inf"))
        return torch.softmax(s, -1) @ self.v


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn()

    def forward(self, h, pos):
        return h + self.attn(h, pos)


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.layers = nn.ModuleList(Layer() for _ in range({layers}))
        self.x = torch.zeros(1, 1, {d})
        self.pos = torch.zeros(1, dtype=torch.long)

    def prepare(self, i):
        self.pos.fill_({prompt} + i)
        self.x.copy_(torch.randn(1, 1, {d}))

    @torch.no_grad()
    def step(self):
        h = self.x
        for layer in self.layers:
            h = layer(h, self.pos)
        return h


def make(device):
    return Target()
"""


def _fields(**kw):
    return dict(seed=random.randrange(10**6), d=random.choice([8, 12, 16]), cap=random.choice([32, 48]),
                layers=random.choice([1, 2]), prompt=random.choice([3, 5, 8]), **kw)


def test_each_slice_to_a_passed_position_is_an_origin(tmp_path):
    path, site = write_target(tmp_path / "passed_pos.py", HAZARD, **_fields(vals="self.v[:, :pos + n]"))
    bad = blocking(path)
    got = set(zip(bad.line.astype(int), bad.category))
    assert (site, "dynamic-shape") in got, table(bad)
    assert (marked_line(path, "# VALS"), "dynamic-shape") in got, table(bad)


def test_a_slice_to_the_first_slices_length_follows_it(tmp_path):
    path, site = write_target(tmp_path / "passed_pos_follow.py", HAZARD, **_fields(vals="self.v[:, :keys.size(1)]"))
    bad = blocking(path)
    got = set(zip(bad.line.astype(int), bad.category))
    assert (site, "dynamic-shape") in got, table(bad)
    assert not (bad.line == marked_line(path, "# VALS")).any(), table(bad)


def test_device_position_twin_is_graph_ready(tmp_path):
    path, _ = write_target(tmp_path / "passed_pos_clean.py", CLEAN, **_fields())
    bad = blocking(path)
    assert bad.empty, table(bad)
