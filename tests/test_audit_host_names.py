"""A host attribute made through a local or with a module constant is still host memory sent each step.

Rotary frequencies kept as a plain attribute, `inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))` then
`self.inv_freq = inv`, are made in pageable host memory: `D` is a module-level number and `inv` a local bound to a
host computation. Moving the attribute to the device in the step (`self.inv_freq.to(self.dev)`) copies it from
pageable memory at every forward. A name the source cannot settle (a parameter) still hides where it lives.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, table, write_target

TARGET = """
import torch

D = {d}


class Target:
    def __init__(self, device, base=10000.0):
        self.dev = device
        self.x = torch.zeros(D // 2, device=device)
        {init}

    def prepare(self, i):
        self.x.copy_(torch.randn(D // 2))

    def step(self):
        return self.x * self.inv_freq.to(self.dev)  # SITE


def make(device):
    return Target(device)
"""

INITS = {
    "local": "inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))\n        self.inv_freq = inv",
    "constant": "self.inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))",
    "param": "self.inv_freq = base ** (torch.arange(0, D, 2, device=device).float() / D)",
}


@pytest.mark.parametrize("kind", sorted(INITS))
def test_a_host_attribute_through_a_local_or_a_constant_is_sent_each_step(tmp_path, kind):
    path, site = write_target(tmp_path / f"rope_{kind}.py", TARGET, d=random.choice([8, 16]), init=INITS[kind])
    bad = blocking(path)
    copies = bad[bad.category == "pageable-copy"]
    if kind == "param":
        assert not len(copies), table(bad)
    else:
        assert list(copies.line) == [site], table(bad)
