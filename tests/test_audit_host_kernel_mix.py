"""pageable-copy: a kernel computed in the step from torch factories naming no device and host data lifted
beside them, then sent to the device.

A resampler's windowed-sinc kernel built in forward (`t = torch.arange(...) / orig`, then `torch.where(t == 0,
torch.tensor(1.0), t.sin() / t)`) lives in host memory on a GPU: both the factories and the lifted scalar are
host tensors, and so is what torch computes from them alone. `.to(x.device)` of it copies from pageable memory.
The host data lifted by `torch.tensor(1.0)` had broken the chain from the factories to the sent kernel. The twin
builds the kernel on the signal's device (`device=x.device`, `torch.ones_like`): clean."""

from __future__ import annotations

import random

import pytest

from site_util import at, scanned, write_target

TPL = """
import math

import torch
import torch.nn.functional as F


class Target:
    def __init__(self, device):
        self.x = torch.zeros(1, 1, {n}, device=device)
        self.out = torch.zeros(1, {taps}, {n}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, 1, {n}))

    def _kernel(self, dev):
        t = torch.arange(-{w}, {w} + 1, dtype=torch.float32{where})[None, None] / {orig} + \\
            torch.arange({taps}, dtype=torch.float32{where})[:, None, None] / {taps}
        t = t * math.pi
        return {pick}

    @torch.no_grad()
    def step(self):
        k = {fetch}  # SITE
        self.out.copy_(F.conv1d(self.x, k, padding={w}))
        return self.out


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("kind", ["host", "device"])
def test_a_kernel_from_host_factories_and_lifted_data_sent_is_a_pageable_copy(tmp_path, kind):
    w, taps, orig = random.choice([2, 3]), random.choice([2, 3]), random.choice([1, 2])
    if kind == "host":
        where, fetch = "", "self._kernel(None).to(self.x.device)"
        pick = random.choice(["torch.where(t == 0, torch.tensor(1.0), t.sin() / t)",
                              "torch.where(t.abs() < 1e-6, torch.tensor([1.0]), t.sin() / t)"])
    else:
        where, fetch = ", device=dev", "self._kernel(self.x.device)"
        pick = "torch.where(t == 0, torch.ones_like(t), t.sin() / t)"
    path, site = write_target(tmp_path / "sinc.py", TPL, n=random.choice([16, 24]), taps=taps, w=w, orig=orig,
                              where=where, pick=pick, fetch=fetch)
    df = scanned(path).df
    df = df[df.severity != "info"]
    shown = df[["category", "line", "message"]].to_string()
    assert len(at(df, "pageable-copy", site)) == (kind == "host"), shown
    assert len(df) == (kind == "host"), shown
