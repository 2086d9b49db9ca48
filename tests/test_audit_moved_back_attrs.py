"""A host tensor attribute that its own class moves to the device and stores back is copied once, not per step.

transformers' `EosTokenCriteria` keeps `self.eos_token_id = torch.tensor(eos)` (no device) and starts each call
with `self.eos_token_id = self.eos_token_id.to(input_ids.device)`: the first (warmup) call moves it, every later
call finds it on the device and copies nothing. A target that places its own tensors on a device made every
host-born tensor its objects held a pageable-copy, this one included. A class that only sends a copy
(`ids = self.ids.to(x.device)`, `SuppressTokensLogitsProcessor`) copies every step and stays reported.
"""

from __future__ import annotations

import random

import pytest

from site_util import install_library, scanned, table, write_target

LIB = """
import torch


class {cls}:
    def __init__(self, ids):
        self.{attr} = torch.tensor(ids)

    def __call__(self, tokens):
        {stored}self.{attr}.to(tokens.device)
        return torch.isin(tokens, {use}).any(dim=-1)
"""

TARGET = """
import torch
import {mod} as lib


class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {v}, generator=g).to(device)
        self.x = torch.zeros(2, {d}, device=device)
        self.tok = torch.zeros(2, 1, dtype=torch.long, device=device)
        self.done = torch.zeros(2, dtype=torch.bool, device=device)
        self.crit = lib.{cls}({ids})

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}))

    def step(self):
        self.tok.copy_((self.x @ self.w).argmax(-1, keepdim=True))
        self.done.logical_or_(self.crit(self.tok))  # SITE
        return self.done


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("stored", [True, False])
def test_an_attribute_moved_back_by_its_class_is_not_a_copy_per_step(tmp_path, monkeypatch, stored):
    cls = random.choice(["EosCriteria", "StopIds", "Banned"])
    attr = random.choice(["eos_token_id", "stop_ids", "ids"])
    src = LIB.format(cls=cls, attr=attr, stored=f"self.{attr} = " if stored else "ids = ",
                     use=f"self.{attr}" if stored else "ids")
    mod, _ = install_library(tmp_path, monkeypatch, src, prefix="crit")
    v = random.choice([16, 32])
    ids = random.sample(range(v), random.randint(1, 3))
    path, site = write_target(tmp_path / "target" / "crit_target.py", TARGET, mod=mod, cls=cls, ids=ids,
                              seed=random.randrange(2**31), d=random.choice([4, 8]), v=v)
    inv = scanned(path, forget=mod)
    copies = inv.df[inv.df.category == "pageable-copy"]
    if stored:
        assert not len(copies), table(inv.df)
        assert not len(inv.blocking()), table(inv.blocking())
        return
    assert len(copies) == 1 and copies.iloc[0].caller_line == site, table(inv.df)
    assert copies.iloc[0].severity == "blocks-capture"
