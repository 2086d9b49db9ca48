"""A subclass's `__init__` that makes again, on the host, an attribute its base placed on a device.

A quantizer's base class keeps its scale on the device (`torch.full((), s, device=device)`); a variant made from
checkpoint metadata calls `super().__init__(device)` and then sets `self.scale = torch.tensor(s)`, a host
tensor moved with `.to(x.device)` at every call: a pageable copy on a GPU. The host-attribute rule let any device
placement in the class hierarchy win (meant for a lazy set-up moving a mixin's host counter to the device), so
the base's `__init__`, which runs first, hid the subclass's. An assignment after `super().__init__()` runs last:
the copy is reported; a subclass that makes it on the device again, or sets it before `super().__init__()`, is
clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, write_target

LIB = """
import torch


class Quantizer:
    def __init__(self, device, scale={s}):
        self.scale = torch.full((), scale, device=device)

    def __call__(self, x):
        s = self.scale.to(x.device, x.dtype)  # LIBSITE
        return torch.round(x / s) * s


class {cls}(Quantizer):
    def __init__(self, device, scale={s}):
{init}
"""

INITS = {"host_after": "        super().__init__(device, scale)\n        self.scale = torch.tensor(scale)",
         "device_after": "        super().__init__(device, scale)\n        self.scale = torch.full((), scale * 2, device=device)",
         "host_before": "        self.scale = torch.tensor(scale)\n        super().__init__(device, scale)"}

TARGET = """
import torch
from {mod} import {cls}


class Target:
    def __init__(self, device):
        self.q = {cls}(device)
        self.x = torch.zeros(2, {d}, device=device)
        self.out = torch.zeros(2, {d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}))

    def step(self):
        y = self.q(self.x * 2)  # SITE
        self.out.copy_(y)
        return self.out


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("order", ["host_after", "device_after", "host_before"])
def test_attribute_made_again_by_a_subclass(tmp_path, monkeypatch, order):
    cls = random.choice(["HostScaleQuantizer", "CkptQuantizer"])
    src = LIB.format(cls=cls, init=INITS[order], s=random.choice([0.05, 0.1, 0.02]))
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="rq")
    path, site = write_target(tmp_path / "target" / "rq.py", TARGET, mod=mod, cls=cls, d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "hit" if order == "host_after" else "clean", "pageable-copy", lib, path, site)
