"""data-dependent-control: a processor that runs no op on one side of its own branch, first in a list that calls
each processor from both arms of an `if`, is named at its own branch.

transformers' `LogitsProcessorList.__call__` calls every processor from `if len(args) > 2: ... else: scores =
processor(ids, scores)`. A custom processor counting its calls in Python (`self.calls += 1`) and masking EOS only
`if self.calls <= self.n:` runs no torch op once the count passes; first in the list, nothing of its own ran before
the branch, so both steps went on from the list's call line. The loop-body guard rule took the list's `if`, which
calls the processor either way, for the switch of a processor toggled per request (audit/detectors/branches/call_arms.py)."""

from __future__ import annotations

import random

import pytest
from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import inspect

import torch


class ProcList(list):
    def __call__(self, ids, scores, **kwargs):
        for proc in self:
            params = inspect.signature(proc.__call__).parameters
            if len(params) > 2:
                scores = proc(ids, scores, **kwargs)
            else:
                scores = proc(ids, scores)
        return scores


class Scale:
    def __call__(self, ids, scores):
        return scores * {scale}
"""

TARGET = """
import torch
from {mod} import ProcList, Scale


class EarlyEos:
    def __init__(self, eos, n):
        self.eos, self.n, self.calls = eos, n, 0

    def __call__(self, ids, scores):
        self.calls += 1
        if self.calls <= self.n:  # BRANCH
            scores = scores.clone()
            scores[:, self.eos] = float("-inf")
        return scores


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {v})
        self.ids = torch.zeros(1, 3, dtype=torch.long)
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {v})
        self.procs = ProcList([EarlyEos({eos}, {n}), Scale()])

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    @torch.no_grad()
    def step(self):
        scores = self.procs(self.ids, self.x @ self.w)  # SITE
        self.out.copy_(scores)
        return self.out


def make(device):
    return Target()
"""


@pytest.mark.parametrize("kind", ["flips", "never"])
def test_the_processors_own_branch_is_named_not_the_lists_call_arms(tmp_path, monkeypatch, kind):
    # calls at audited step k (warmup 2) number 3 + k: "flips" turns the branch off inside the audited steps
    n = random.randrange(3, 6) if kind == "flips" else 0
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(scale=round(random.uniform(0.5, 2), 3)),
                               prefix="arms")
    v = random.choice([8, 16])
    path, _ = write_target(tmp_path / "target" / "arms_target.py", TARGET, mod=mod, seed=random.randrange(2**31),
                           d=random.choice([4, 8]), v=v, eos=random.randrange(v), n=n)
    bad = blocking(path, forget=mod)
    ddc = bad[bad.category == "data-dependent-control"]
    if kind == "never":
        assert not len(ddc), table(bad)
        return
    assert len(ddc) == 1 and ddc.iloc[0].file.endswith(path.name), table(bad)
    assert int(ddc.iloc[0].line) == marked_line(path, "# BRANCH"), table(bad)
