"""baked-host-value: a tensor built from host data that only host code reads is no baked value of its own.

Segment offsets built from the request lengths (`torch.cumsum(torch.tensor(lens), 0).tolist()`) change every
step, but no device op reads them: on a GPU that is CPU work, and whatever value it hands on is reported where
a device op takes it. The same host tensor used as an operand of a device op (`h * torch.tensor(lens).sum()`)
is baked at capture: reported at the line that built it."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch


def offsets(h, lens):
    t = torch.tensor(lens, dtype=torch.float32)  # LIBSITE
    {use}
    return h * {scale}
"""

USES = {"clean": ["off = torch.cumsum(t, 0).tolist()", "n = int(t.sum())", "m = t.max().item() + len(t.tolist())"],
        "hit": ["h = h * t.sum()", "h = h + t.mean()"]}


@pytest.mark.parametrize("kind", ["hit", "clean"])
def test_lifted_host_data_baked_only_when_a_device_op_reads_it(tmp_path, monkeypatch, kind):
    src = LIB.replace("{use}", random.choice(USES[kind])).replace("{scale}", str(random.uniform(0.5, 2.0)))
    k = random.choice([2, 3, 4])
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, src, "lens", "offsets", "offsets(self.x @ self.w, self.lens)",
        init=f"        self.lens = [1] * {k}",
        prepare=f"        self.lens = [(i * {random.choice([1, 2, 3, 4])} + j) % 5 + 1 for j in range({k})]")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "baked-host-value", lib, path, site)
