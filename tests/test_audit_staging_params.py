"""A pinned staging buffer handed to a helper that fills it through a numpy view (audit/detectors/host/staging_params.py).

xgrammar-style matchers fill the next step's packed token bitmask into a buffer they are given:
`self.matcher.fill(self.mask_cpu)`, whose body writes `out.numpy()[0, :] = packed`. That runs no torch op, so the
helper is on no op's stack, and it names the buffer by its parameter. The write is found in the helper the call
resolves to (a method of an object the target holds, or a module function), with the call as caller. The same
fill in prepare() is the legal form."""

from __future__ import annotations

import random

import pytest
from site_util import blocking, marked_line, table, write_target

TARGET = """
import numpy as np
import torch

V, W = {v}, {w}


class Matcher:
    def __init__(self):
        self.rows = np.random.default_rng({seed}).integers(0, 2**31 - 1, size=(5, W)).astype(np.int32)
        self.state = 0

    def fill(self, out):
        out.numpy()[0, :] = self.rows[self.state % len(self.rows)]  # WRITE

    def advance(self):
        self.state += 1


def fill_rows(buf, row):
    np.copyto(buf.numpy()[0], row)  # WRITE_FN


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.m = Matcher()
        self.mask_cpu = torch.zeros(1, W, dtype=torch.int32, pin_memory=torch.cuda.is_available())
        self.mask = torch.zeros(1, W, dtype=torch.int32)
        self.x = torch.zeros(1, W)
        self.out = torch.zeros(1, W)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, W))
        self.m.advance()
{prep}

    @torch.no_grad()
    def step(self):
{fill}
        self.mask.copy_(self.mask_cpu, non_blocking=True)
        self.out.copy_(torch.where((self.mask & 1).bool(), self.x, 0.0))
        return self.out


def make(device):
    return Target()
"""

FILLS = {"method": ("self.m.fill(self.mask_cpu)", "# WRITE"),
         "function": ("fill_rows(self.mask_cpu, self.m.rows[self.m.state % 5])", "# WRITE_FN")}


@pytest.mark.parametrize("how", sorted(FILLS))
@pytest.mark.parametrize("where", ["step", "prepare"])
def test_a_helper_filling_a_handed_pinned_buffer(tmp_path, monkeypatch, how, where):
    call, marker = FILLS[how]
    fill = f"        {call}  # SITE" if where == "step" else "        pass  # SITE"
    prep = f"        {call}" if where == "prepare" else ""
    (tmp_path / "target").mkdir()
    path, site = write_target(tmp_path / "target" / "matcher_target.py",
                              TARGET.replace("{fill}", fill).replace("{prep}", prep),
                              v=random.choice([64, 96]), w=random.choice([2, 3]), seed=random.randrange(2**31))
    bad = blocking(path)
    fx = bad[bad.category == "cpu-side-effect"]
    if where == "prepare":
        assert not len(fx), table(bad)
        return
    assert list(fx.line.astype(int)) == [marked_line(path, marker)], table(bad)
    assert int(fx.iloc[0].caller_line) == site, fx[["caller_file", "caller_line"]].to_string()
