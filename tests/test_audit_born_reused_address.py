"""Host memory a target computes while it is built (`w = torch.randn(o, i) * 0.05; scb = w.abs().amax(1)`,
a quantizer's row scales kept in a plain state object) stays host memory on a GPU, and a step that sends it
on with `.to(x.device)` copies from pageable memory every step. Each op's output is noted by its storage's
address; a temporary made from host memory and freed (`torch.randn(o, i)` before its `* 0.05`) leaves its
note behind, and the allocator hands that address to the next output of the same size: that stale note must
not hide the new output, or the row scales read as device memory and the copy goes unreported."""

from __future__ import annotations

import random

import torch

import audit
from audit.scan.patches import host_sends
from site_util import at, table, write_target

TARGET = """
import torch
from torch import nn


class State:
    def __init__(self, codes, absmax, rowmax):
        self.codes, self.absmax, self.rowmax = codes, absmax, rowmax


class Int8Linear(nn.Module):
    def __init__(self, device):
        super().__init__()
        torch.manual_seed({seed})
        w = torch.randn({o}, {i}) * 0.05
        rowmax = w.abs().amax(dim=1)
        absmax = w.abs().amax() * torch.ones(1)
        codes = (w / rowmax[:, None] * 127).round().to(torch.int8)
        self.state = State(codes.to(device), absmax{place}, rowmax{place})
        self.bias = nn.Parameter(torch.zeros({o}, device=device))

    def forward(self, x):
        rowmax = self.state.rowmax.to(x.device, non_blocking=True)  # SITE
        absmax = self.state.absmax.to(x.device)  # SITE2
        w = self.state.codes.to(x.dtype) * (rowmax / 127.0).unsqueeze(1) * (absmax / absmax)
        return nn.functional.linear(x, w, self.bias)


class Target:
    def __init__(self, device):
        self.lin = Int8Linear(device)
        self.x = torch.zeros(2, {i}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {i}))

    @torch.no_grad()
    def step(self):
        return self.lin(self.x)


def make(device="cpu"):
    return Target(device)
"""


def _write(tmp_path, place: str):
    fields = dict(seed=random.randrange(2**31), o=random.choice([32, 64, 96]), i=random.choice([64, 128]), place=place)
    path, site = write_target(tmp_path / "born_target.py", TARGET, **fields)
    return path, site, site + 1


def test_host_scales_computed_at_build_and_sent_each_step_are_pageable_copies(tmp_path):
    path, site, site2 = _write(tmp_path, "")
    bad = audit.scan(f"{path}:make", device="cpu", steps=3).blocking()
    for line, name in ((site, "rowmax"), (site2, "absmax")):
        hit = at(bad, "pageable-copy", line)
        assert len(hit) == 1, table(bad)
        assert name in hit.iloc[0].message


def test_scales_placed_on_the_device_at_build_are_clean(tmp_path):
    path, _, _ = _write(tmp_path, ".to(device)")
    bad = audit.scan(f"{path}:make", device="cpu", steps=3).blocking()
    assert len(bad) == 0, table(bad)


def test_an_output_at_a_freed_temporarys_address_is_still_noted():
    for _ in range(8):
        host_sends.forget()
        o, i = random.choice([32, 64]), random.choice([64, 128])
        with host_sends.Sends():
            w = torch.randn(o, i) * 0.05  # the randn temporary is freed here
            scb = w.abs().amax(dim=1)  # abs may take its address
        assert host_sends.born(scb.untyped_storage()._cdata) is not None
    host_sends.forget()
