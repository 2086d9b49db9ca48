"""data-dependent-control: a slice torch skips because its staged bound covers the whole dimension is no branch.

A streaming resampler stages chunks of several lengths into a fixed buffer and slices it with the Python length
(`chunk = self.buf[..., : self.n]`). When a chunk fills the buffer, torch's indexing skips every slice and returns
an alias: that step runs `aten.alias` where the others run `aten.slice`, and the statement's ops end there (the next
op is on another line). With a leading index (`self.buf[0, : self.n]`) the full-length step runs the `select` and
no slice. Neither is a fork: the changing bound is the dynamic-shape at that line. A conditional expression that
slices on one side only (`x if self.full else x[:, :k]`, k fixed) is a branch and stays one."""

from __future__ import annotations

import random

import pytest

from site_util import at, scanned, write_target

TPL = """
import torch

MAXC = {maxc}
LENS = {lens}


class Target:
    def __init__(self):
        self.buf = torch.zeros(2, 1, MAXC)
        self.w = torch.randn(1, 1, 3)
        self.n = MAXC
        self.full = True

    def prepare(self, i):
        self.n = LENS[i % len(LENS)]
        self.full = self.n == MAXC
        self.buf.copy_(torch.randn(2, 1, MAXC))

    @torch.no_grad()
    def step(self):
        x = {expr}  # SITE
        return torch.nn.functional.conv1d(x, self.w, padding=1)


def make(device):
    return Target()
"""

EXPRS = {"all": "self.buf[..., : self.n]", "select": "self.buf[:1, 0, : self.n]",
         "branch": "self.buf if self.full else self.buf[..., : MAXC // 2]"}


@pytest.mark.parametrize("kind", list(EXPRS))
def test_a_full_length_slice_torch_skips_is_no_fork(tmp_path, kind):
    maxc = random.choice([24, 32, 48])
    part = random.sample(range(4, maxc), 3)
    lens = [maxc, maxc, part[0], maxc, part[1], maxc, part[2]]  # warmup 2, then full / partial alternate
    path, site = write_target(tmp_path / "resample.py", TPL, maxc=maxc, lens=lens, expr=EXPRS[kind])
    inv = scanned(path, steps=5)
    df = inv.df[inv.df.severity != "info"]
    if kind == "branch":
        assert len(at(df, "data-dependent-control", site)) == 1, df[["category", "line", "message"]].to_string()
        return
    assert len(at(df, "data-dependent-control", site)) == 0, df[["category", "line", "message"]].to_string()
    assert len(at(df, "dynamic-shape", site)) == 1, df[["category", "line", "message"]].to_string()
