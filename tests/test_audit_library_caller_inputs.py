"""Two rebound inputs first read on one library line from two of the target's lines are two
stale-input-pointer findings, one per calling line, each naming its attribute.

A mask helper (torch_einops_utils' `lens_to_mask(lens, max_len)`) is called for the query lengths and
again for the key lengths, both rebound in prepare(). The stale-pointer rule grouped the first reads by
source line alone, so one finding named one attribute and the other rebinding went unreported.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import torch


def lens_to_mask(lens, max_len):
    return torch.arange(max_len) < lens[:, None]  # LIBSITE
"""

TARGET = """
import torch
from {mod} import lens_to_mask

B, N = {b}, {n}


class Target:
    def __init__(self):
        self.gen = torch.Generator().manual_seed({seed})
        self.q_lens = torch.ones(B, dtype=torch.long)
        self.k_lens = torch.ones(B, dtype=torch.long)
        self.out = torch.zeros(B, N)

    def prepare(self, i):
        q = torch.randint(1, N, (B,), generator=self.gen)
        k = torch.randint(1, N, (B,), generator=self.gen)
        {refill}

    def step(self):
        qm = lens_to_mask(self.q_lens, N)  # FIRST
        km = lens_to_mask(self.k_lens, N)  # SECOND
        self.out.copy_((qm & km).float())
        return self.out


def make(device):
    return Target()
"""

REFILL = {"rebound": "self.q_lens, self.k_lens = q, k", "static": "self.q_lens.copy_(q); self.k_lens.copy_(k)"}


@pytest.mark.parametrize("kind", ["rebound", "static"])
def test_each_calling_line_of_a_library_input_read_is_a_finding(tmp_path, monkeypatch, kind):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="maskutil")
    path, _ = write_target(tmp_path / "target" / "two_masks.py", TARGET, marker="# FIRST", mod=mod,
                           seed=random.randrange(2**31), b=random.randrange(2, 5), n=random.choice([6, 8, 12]),
                           refill=REFILL[kind])
    bad = blocking(path, forget=mod)
    stale = bad[bad.category == "stale-input-pointer"]
    if kind == "static":
        assert not len(stale), table(bad)
        return
    hits = stale[stale.file.str.endswith(lib.name) & (stale.line == marked_line(lib, "# LIBSITE"))]
    callers = {marked_line(path, "# FIRST"): "`q_lens`", marked_line(path, "# SECOND"): "`k_lens`"}
    assert set(hits.caller_line.astype(int)) == set(callers) and len(hits) == 2, table(bad)
    for _, h in hits.iterrows():
        assert callers[int(h.caller_line)] in h.message, table(bad)
