"""A module's plain tensor attribute stays where its factory put it: `module.to(device)` moves parameters and
buffers only.

A streaming encoder keeps its frame counter as `self.offset = torch.zeros((), dtype=torch.long)` (not a buffer)
beside a registered position table, and its holder moves the module with `.to(device)`. On a GPU the counter is
a host tensor: `self.pe[self.offset]` reads its value on the host (no device wait; the position is a baked value)
and `self.offset += 1` is host bookkeeping a replay skips (cpu-side-effect). A CPU scan took it for a device
tensor and reported a host-sync. The twins: the counter registered as a buffer (a device tensor: the index is
the read), and a holder that moves the attribute itself (`self.pos.offset = self.pos.offset.to(device)`)."""

from __future__ import annotations

import random

import pytest

from site_util import at, scanned, write_target

TPL = """
import torch
from torch import nn


class {cls}(nn.Module):
    def __init__(self, n, d):
        super().__init__()
        self.register_buffer("pe", torch.randn(n, d))
        {counter}

    def forward(self, x):
        y = x + self.pe[self.{attr}]  # SITE
        self.{attr} += 1  # BUMP
        return y


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.pos = {cls}(64, {d}).to(device)
        {move}
        self.x = torch.zeros(1, {d}, device=device)
        self.out = torch.zeros(1, {d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    @torch.no_grad()
    def step(self):
        self.out.copy_(self.pos(self.x))
        return self.out


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("kind", ["plain", "buffer", "holder_moves"])
def test_a_modules_plain_counter_is_host_memory(tmp_path, kind):
    cls, attr = random.choice(["StreamingPos", "PosEnc"]), random.choice(["offset", "frame_idx", "t"])
    factory = random.choice(["torch.zeros((), dtype=torch.long)", "torch.tensor(0)"])
    counter = f'self.register_buffer("{attr}", {factory})' if kind == "buffer" else f"self.{attr} = {factory}"
    move = f"self.pos.{attr} = self.pos.{attr}.to(device)" if kind == "holder_moves" else "pass"
    path, site = write_target(tmp_path / "posenc.py", TPL, cls=cls, attr=attr, counter=counter, move=move,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bump = site + 1
    df = scanned(path).df
    df = df[df.severity != "info"]
    shown = df[["category", "line", "message"]].to_string()
    if kind == "plain":
        assert len(at(df, "host-sync", site)) == 0, shown
        assert len(at(df, "baked-host-value", site)) == 1, shown
        assert len(at(df, "cpu-side-effect", bump)) == 1, shown
    else:  # a device counter: indexing with it reads it back; advancing it in place is device work
        assert len(at(df, "host-sync", site)) == 1, shown
        assert len(at(df, "cpu-side-effect", bump)) == 0, shown
