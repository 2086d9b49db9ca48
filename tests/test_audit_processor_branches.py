"""data-dependent-control: a branch inside one processor of a processor list, named at that branch.

transformers' `LogitsProcessorList.__call__` calls each processor from inside an `if len(args) > 2: ...
else: scores = processor(ids, scores)` in its loop body; `MinLengthLogitsProcessor` then masks the EOS
token only `if input_ids.shape[-1] < self.min_length:`. Once the sequence reaches that length, a step
runs two ops fewer inside that call and goes on with the next processor. The loop-body guard rule
(test_audit_loop_guard.py) took the list's `if` (which both steps took the same way) for the decision:
the extra ops continue the call the last shared op was in, so the processor's own `if` decided."""

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
            args = inspect.signature(proc.__call__).parameters
            if len(args) > 2:
                scores = proc(ids, scores, **kwargs)
            else:
                scores = proc(ids, scores)
        return scores


class MinLength:
    def __init__(self, min_length, eos):
        self.min_length, self.eos = min_length, eos

    def __call__(self, ids, scores):
        vocab = torch.arange(scores.shape[-1], device=scores.device)
        out = scores.clone()
        if ids.shape[-1] < self.min_length:  # LIBSITE
            out = torch.where(vocab == self.eos, -float("inf"), scores)
        return out


class Scale:
    def __call__(self, ids, scores):
        return scores * {scale}
"""

TARGET = """
import torch
from {mod} import MinLength, ProcList, Scale


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {d})
        self.ids = torch.zeros(1, {p}, dtype=torch.long)
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})
        self.procs = ProcList([MinLength({min_len}, 0), Scale()])

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    @torch.no_grad()
    def step(self):
        scores = self.x @ self.w
        self.ids = torch.cat([self.ids, scores.argmax(-1, keepdim=True)], dim=-1)
        scores = self.procs(self.ids, scores)  # SITE
        self.out.copy_(scores)
        return self.out


def make(device):
    return Target()
"""


@pytest.mark.parametrize("kind", ["flips", "never"])
def test_the_processor_branch_is_named_not_the_list_loop_guard(tmp_path, monkeypatch, kind):
    p = random.randrange(2, 9)
    # the length at audited step k (warmup 2) is p + 3 + k: the branch flips after the first audited steps
    min_len = p + 3 + random.randrange(1, 4) if kind == "flips" else 0
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(scale=round(random.uniform(0.5, 2), 3)),
                               prefix="procs")
    path, site = write_target(tmp_path / "target" / "proc_target.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), p=p, min_len=min_len)
    bad = blocking(path, forget=mod)
    ddc = bad[bad.category == "data-dependent-control"]
    if kind == "never":
        assert not len(ddc), table(bad)
        return
    assert len(ddc) == 1 and ddc.iloc[0].file.endswith(lib.name), table(bad)
    assert int(ddc.iloc[0].line) == marked_line(lib, "# LIBSITE"), table(bad)
    assert ddc.iloc[0].caller_file.endswith(path.name) and int(ddc.iloc[0].caller_line) == site, table(bad)
