"""A library branch reached from two of the target's lines that forks the op sequence is one
data-dependent-control finding per calling line.

rotary_embedding_torch's `forward` slices its cached freqs while `offset + seq_len` fits the cached length
and computes them afresh past it; a decode step rotates the queries and the keys through it, so both calls
fork when the position crosses the prompt's cached length. The forks were merged per branch line, naming the
query's call only: fixing that one (a device position there) left the key's fork unreported.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import torch

CACHED = {cached}
TABLE = torch.linspace(0.0, 3.0, 64)[:, None] * torch.linspace(0.1, 1.0, {d})


def rotate(t, offset=0):
    n = t.shape[0]
    if offset + n <= CACHED:  # LIBSITE
        ang = TABLE[offset:offset + n]
    else:
        ang = (torch.arange(n) + offset)[:, None].float() * torch.linspace(0.1, 1.0, t.shape[-1]) * (3.0 / 63)
    return t * ang.cos() + t.flip(-1) * ang.sin()
"""

TARGET = """
import torch
from {mod} import rotate

D = {d}


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.wq = torch.randn(D, D, generator=g)
        self.wk = torch.randn(D, D, generator=g)
        self.x = torch.zeros(1, D)
        self.out = torch.zeros(1, D)
        self.pos = 0

    def prepare(self, i):
        self.x.copy_(torch.randn(1, D))
        self.pos = {start} + i

    def step(self):
        q = rotate(self.x @ self.wq, offset=self.pos)  # FIRST
        k = rotate(self.x @ self.wk, offset=self.pos)  # SECOND
        self.out.copy_(q * k)
        return self.out


def make(device):
    return Target()
"""


@pytest.mark.parametrize("kind", ["crossing", "past"])
def test_each_calling_line_of_a_library_fork_is_a_finding(tmp_path, monkeypatch, kind):
    cached = random.randrange(6, 12)
    d = random.choice([4, 8])
    # prepare(i) for 2 warmup and 4 audited steps: the crossing kind crosses the cached length while audited
    start = cached - 3 if kind == "crossing" else cached + 1
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(cached=cached, d=d), prefix="ropefork")
    path, _ = write_target(tmp_path / "target" / "two_forks.py", TARGET, marker="# FIRST", mod=mod,
                           seed=random.randrange(2**31), d=d, start=start)
    bad = blocking(path, forget=mod)
    forks = bad[(bad.category == "data-dependent-control") & bad.file.str.endswith(lib.name)]
    if kind == "past":
        assert not len(forks), table(bad)
        return
    assert set(forks.line) == {marked_line(lib, "# LIBSITE")}, table(bad)
    callers = {marked_line(path, "# FIRST"), marked_line(path, "# SECOND")}
    assert set(forks.caller_line.astype(int)) == callers and len(forks) == 2, table(bad)
