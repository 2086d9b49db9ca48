"""Layers kept on the host and run there inside the step (a device_map split: `self.tail.to("cpu")`).

The hidden state hops to the host (`h.to("cpu")`, a host-sync), the host layers run on it, and the result goes back
with `h.to(device)`: a copy from pageable memory, which capture refuses. On a CPU scan the hop is a no-op and the
host layers' weights are module parameters, so the result looked like device memory. The parameters the source sent
to the host are host memory, and an op reading a host operand that is no scalar runs on the host on a GPU: what it
makes is host memory too. Layers moved to the device are no finding.
"""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

TARGET = """
import torch
from torch import nn


class Split(nn.Module):
    def __init__(self, device):
        super().__init__()
        torch.manual_seed({seed})
        self.device = device
        self.head = nn.ModuleList([nn.Linear({d}, {d}) for _ in range(2)]).to(device)
        self.tail = nn.ModuleList([nn.Linear({d}, {d}) for _ in range({n})]).to({tail})
        self.x = torch.zeros(1, {d}, device=device)
        self.out = torch.zeros(1, {d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.full((1, {d}), 0.1 * (i + 1)))

    @torch.no_grad()
    def step(self):
        h = self.x
        for layer in self.head:
            h = torch.relu(layer(h))
        h = h.to({hop})
        for layer in self.tail:
            h = {act}(layer(h))
        h = h.to(self.device)  # SITE
        self.out.copy_(h)
        return self.out


def make(device):
    return Split(device)
"""


def _target(tmp_path, tail: str, hop: str):
    return write_target(tmp_path / f"split_{random.randrange(10**9)}.py", TARGET, seed=random.randrange(2**31),
                        d=random.choice([4, 8]), n=random.choice([1, 2]), tail=tail, hop=hop,
                        act=random.choice(["torch.relu", "torch.tanh"]))


def test_host_layers_output_sent_back_is_a_pageable_copy(tmp_path):
    path, site = _target(tmp_path, random.choice(['"cpu"', 'torch.device("cpu")']), random.choice(['"cpu"', "'cpu'"]))
    bad = blocking(path)
    hit = bad[(bad.category == "pageable-copy") & (bad.line == site)]
    assert len(hit) == 1 and hit.iloc[0].severity == "blocks-capture", table(bad)


def test_layers_on_the_device_send_nothing_back(tmp_path):
    path, site = _target(tmp_path, "device", "self.device")
    bad = blocking(path)
    assert not len(bad[bad.category == "pageable-copy"]), table(bad)
