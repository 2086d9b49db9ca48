"""A library attribute made on the device its constructor is given, the CPU by default
(audit/detectors/host/default_device.py).

transformers' `SuppressTokensLogitsProcessor(suppress_tokens, device="cpu")` keeps its token list as
`torch.tensor(list(tokens), device=device)` and sends it with `.to(scores.device)` on every call. Built without a
device, that list is pageable host memory on a GPU, and the `.to()` is a pageable copy inside the step; built
with the target's device (by keyword or by position), the `.to()` does nothing. Only the target's constructions
tell the two apart on a CPU scan.
"""

from __future__ import annotations

import random

import pytest

from site_util import SEEDED_TARGET, blocking, clean_or_hit, install_library, write_target

LIB = """
import torch


class BannedTokens:
    def __init__(self, ids, fill, device="cpu"):
        self.fill = fill
        self.ids = torch.tensor(list(ids), dtype=torch.long, device=device)

    def __call__(self, scores):
        vocab = torch.arange(scores.shape[-1], device=scores.device)
        banned = torch.isin(vocab, self.ids.to(scores.device))  # LIBSITE
        return torch.where(banned, self.fill, scores)


class Moved(BannedTokens):
    def __call__(self, scores):
        self.ids = self.ids.to(scores.device)
        return super().__call__(scores)
"""

TARGET = """
import torch
from {mod} import BannedTokens, Moved


""" + SEEDED_TARGET + """        self.ban = {make}

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    @torch.no_grad()
    def step(self):
        y = self.ban(self.x @ self.w)  # SITE
        self.out.copy_(y)
        return self.out


def make(device):
    return Target(device)
"""

KINDS = {"default": ("BannedTokens({ids}, -1e4)", "hit"),
         "keyword": ("BannedTokens({ids}, -1e4, device=device)", "clean"),
         "positional": ("BannedTokens({ids}, -1e4, device)", "clean"),
         "moved on first use": ("Moved({ids}, -1e4)", "clean")}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_defaulted_cpu_device_is_host_memory(tmp_path, monkeypatch, kind):
    make, want = KINDS[kind]
    d = random.choice([4, 8, 16])
    ids = sorted(random.sample(range(d), random.randint(1, 3)))
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="banned")
    path, site = write_target(tmp_path / "target" / "banned_target.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              d=d, make=make.format(ids=ids))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, want, "pageable-copy", lib, path, site)
