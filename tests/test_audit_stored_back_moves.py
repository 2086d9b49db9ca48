"""A quantizer's host state moved lazily by the forward and assigned back to the attribute it came from
(`qs.absmax = qs.absmax.to(x.device)`, bitsandbytes' QuantState moved on first use) is on the device from the
warm-up on: the steady step's `.to` copies nothing. The same move kept in a local (`absmax =
qs.absmax.to(x.device)`) leaves the attribute on the host and copies from pageable memory every step."""

from __future__ import annotations

import random

import audit
from site_util import at, table, write_target

TARGET = """
import torch
from torch import nn


class QuantState:
    def __init__(self, absmax, code):
        self.absmax, self.code = absmax, code


class Linear4bit(nn.Module):
    def __init__(self, device):
        super().__init__()
        torch.manual_seed({seed})
        self.packed = torch.randint(0, 16, ({o} * {i},), dtype=torch.uint8, device=device)
        self.qs = QuantState(torch.rand({o} * {i} // {block}) + 0.5, torch.linspace(-1, 1, 16))

    def forward(self, x):
        qs = self.qs
        {absmax}  # SITE
        {code}  # SITE2
        w = (code[self.packed.long()].view(-1, {block}) * absmax[:, None]).view({o}, {i})
        return x @ w.t()


class Target:
    def __init__(self, device):
        self.lin = Linear4bit(device)
        self.x = torch.zeros(2, {i}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {i}))

    @torch.no_grad()
    def step(self):
        return self.lin(self.x)


def make(device="cpu"):
    return Target(device)
"""

STORED = ("qs.absmax = qs.absmax.to(x.device); absmax = qs.absmax",
          "qs.code = qs.code.to(x.device, non_blocking=True); code = qs.code")
LOCAL = ("absmax = qs.absmax.to(x.device)", "code = qs.code.to(x.device, non_blocking=True)")


def _scan(tmp_path, lines):
    fields = dict(seed=random.randrange(2**31), o=random.choice([32, 64]), i=random.choice([64, 128]),
                  block=random.choice([32, 64]), absmax=lines[0], code=lines[1])
    path, site = write_target(tmp_path / "stored_back_target.py", TARGET, **fields)
    return audit.scan(f"{path}:make", device="cpu", steps=3).blocking(), site


def test_moves_stored_back_to_their_attribute_are_clean(tmp_path):
    bad, _ = _scan(tmp_path, STORED)
    assert len(bad) == 0, table(bad)


def test_moves_kept_in_a_local_copy_every_step(tmp_path):
    bad, site = _scan(tmp_path, LOCAL)
    for line, name in ((site, "absmax"), (site + 1, "code")):
        hit = at(bad, "pageable-copy", line)
        assert len(hit) == 1, table(bad)
        assert name in hit.iloc[0].message
