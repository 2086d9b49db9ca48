"""A block a decoder runs every r-th step (a KV compressor under `if (pos + 1) % r == 0:`) that indexes with the
host position runs in one audited step only: no second value shows the index change, yet the position it reads
changes every step, so the index is a baked host value. The same block indexing with a device position is not."""

from __future__ import annotations

import random

from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch

R, D, N = {ratio}, {d}, 64


class Compressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.state = torch.zeros(R, D)
        self.cache = torch.zeros(N, D)
        self.table = torch.randn(N, D)

    def forward(self, x, start_pos, dev_pos):
        self.state[start_pos % R] = x  # EVERY
        if (start_pos + 1) % R == 0:  # BRANCH
            kv = self.state.mean(0) * {row}  # ROW
            self.cache[{slot}] = kv  # SLOT


class Target:
    def __init__(self):
        self.comp = Compressor()
        self.x = torch.zeros(D)
        self.pos = {start}
        self.dev_pos = torch.zeros((), dtype=torch.long)

    def prepare(self, i):
        self.x.copy_(torch.randn(D))
        self.pos = {start} + i
        self.dev_pos.fill_(self.pos // R)

    @torch.no_grad()
    def step(self):
        self.comp(self.x, self.pos, self.dev_pos)
        return self.comp.cache

def make(device):
    return Target()
"""


def _scan(tmp_path, row: str, slot: str):
    ratio = 4  # four audited steps (after two warm-up steps): the block runs in exactly one
    path, _ = write_target(tmp_path / "every_r.py", TEMPLATE, "# SLOT", ratio=ratio, d=random.choice([8, 16]),
                           start=random.randrange(ratio), row=row, slot=slot)
    lines = {m: next(n for n, t in enumerate(path.read_text().splitlines(), 1) if f"# {m}" in t)
             for m in ("EVERY", "BRANCH", "ROW", "SLOT")}
    return blocking(path), lines


def test_a_host_index_in_a_block_run_once_is_baked(tmp_path):
    bad, ln = _scan(tmp_path, "1.0", "start_pos // R")
    assert len(at(bad, "baked-host-value", ln["SLOT"])) == 1, table(bad)
    assert len(at(bad, "baked-host-value", ln["EVERY"])) == 1, table(bad)  # run every step: the diff sees it
    assert not len(at(bad, "baked-host-value", ln["ROW"])), table(bad)  # no counter on that line
    assert len(at(bad, "data-dependent-control", ln["BRANCH"])) == 1, table(bad)


def test_a_device_index_in_the_same_block_is_not(tmp_path):
    bad, ln = _scan(tmp_path, "1.0", "dev_pos")
    assert not len(at(bad, "baked-host-value", ln["SLOT"])), table(bad)
    assert not len(at(bad, "baked-host-value", ln["ROW"])), table(bad)
