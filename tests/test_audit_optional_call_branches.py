"""data-dependent-control: a branch inside a processor an optional-argument check lets run.

A generation mixin runs `procs = kwargs.get("logits_processor"); if procs is not None: logits = procs(ids,
logits)`, and the processor blocks EOS while a host length is short (`if self.cur_len < self.min_length:`). When
that length crosses the minimum the steps part inside the processor: the presence check, which held in both,
decided nothing, and the processor's branch is named. When the processor itself comes and goes (None in some
steps) and has no branch of its own, or one on a plain flag that held in every step (`if self.on:`), the presence
check is named."""

from __future__ import annotations

import random

import pytest
from site_util import install_library, marked_line, module_target, table, write_target

LIB = """
import torch


class MinLength:
    def __init__(self, n):
        self.min_length, self.cur_len = n, 0

    def __call__(self, ids, scores):
        if self.cur_len < self.min_length:  # INNER
            scores = scores - 1.0
        return scores


class Scale:
    def __call__(self, ids, scores):
        return torch.tanh(scores)


class Guarded:
    def __init__(self):
        self.on = True

    def __call__(self, ids, scores):
        if self.on:
            scores = torch.tanh(scores)
        return scores


class Mixin:
    def constrained(self, x, kwargs):
        logits = torch.relu(x)
        procs = kwargs.get("logits_processor")
        if procs is not None:  # OUTER
            logits = procs(x, logits)
        return logits
"""


@pytest.mark.parametrize("kind", ["inner", "outer"])
def test_branch_behind_a_presence_check(tmp_path, monkeypatch, kind):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="optcall")
    at = random.randint(3, 5)
    if kind == "inner":
        init = f"        self.m = Mixin()\n        self.p = MinLength({at})\n        self.kw = {{{{'logits_processor': self.p}}}}"
        prepare = "        self.p.cur_len = i"
    else:
        init = "        self.m = Mixin()\n        self.kw = {{}}"
        proc = random.choice(["Scale()", "Guarded()"])  # a branch of its own that always held decides nothing
        prepare = f"        self.kw['logits_processor'] = {proc} if i >= {at} else None"
    tpl = module_target(imports=f"from {mod} import Mixin, MinLength, Scale, Guarded", init=init, prepare=prepare,
                        step="        y = self.m.constrained(self.x, self.kw)  # SITE\n        self.out.copy_(y)")
    path, site = write_target(tmp_path / "target" / "optcall.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]))
    import audit
    import sys
    try:
        bad = audit.scan(f"{path}:make", device="cpu", steps=6).blocking()
    finally:
        sys.modules.pop(mod, None)
    ddc = bad[bad.category == "data-dependent-control"]
    want = marked_line(lib, "# INNER" if kind == "inner" else "# OUTER")
    assert set(ddc.line) == {want} and (ddc.caller_line == site).all(), table(bad)
