"""A clamp on a host length, spelled with the builtin `min`/`max`, turns on a later step as a conditional expression does.

`alpha = max(1.0, self.seq_len / ORIG)` (dynamic NTK scaling without an `if`) returns 1.0 while the length stays
within the trained context, so no op's argument moves in the audited steps and nothing looks baked; once the length
passes ORIG eager decoding takes the other operand while a graph keeps the captured one. A clamp that never turns
(`max(0, self.seq_len)` while the length grows), one on constants alone, one whose operands both move, and the
device-side clamp stay clean; one that returns the moving operand now is the baked value downstream, not a branch.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import torch

ORIG = {orig}


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.exps = torch.arange(0, {d}, 2).float() / {d}
        self.q = torch.zeros(1, {d})
        self.pos = torch.zeros(1, dtype=torch.long)
        self.out = torch.zeros(1, {d})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.seq_len = 0

    def prepare(self, i):
        self.seq_len = i + 1
        self.pos.fill_(i)
        self.q.copy_(torch.randn(1, {d}))

    def step(self):
        alpha = {clamp}  # SITE
        inv_freq = 1.0 / torch.pow(10000.0 * alpha, self.exps)
        f = self.pos.float()[:, None] * inv_freq[None, :]
        emb = torch.cat([f, f], -1)
        self.out.copy_((self.q @ self.w) * emb.cos())
        return self.out


def make(device):
    return Target()
"""

CLAMPS = {  # name: (expression, turns)
    "max-ratio": ("max(1.0, self.seq_len / ORIG)", True),
    "min-shrink": ("min(1.0, ORIG / self.seq_len)", True),
    "never-turns": ("max(0, self.seq_len) * 0.0 + 1.0", False),
    "constants": ("max(1.0, ORIG / 4096)", False),
    "device-clamp": ("torch.clamp((self.pos + 1) / ORIG, min=1.0)", False),
    "moving-pick": ("min(self.seq_len, ORIG) / ORIG", False),  # the value moves now: baked downstream
    "running-extreme": ("max(self.seq_len * 0.0, abs(self.seq_len - 3.5)) * 0.0 + 1.0", False),
}


@pytest.mark.parametrize("kind", sorted(CLAMPS))
def test_a_clamp_on_a_host_length(tmp_path, kind):
    clamp, turns = CLAMPS[kind]
    path, site = write_target(tmp_path / "clamp_target.py", TARGET, clamp=clamp, orig=random.choice([64, 512, 4096]),
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path)
    assert len(at(bad, "data-dependent-control", site)) == (1 if turns else 0), table(bad)
    assert len(bad[bad.category == "baked-host-value"]) == (1 if kind == "moving-pick" else 0), table(bad)
