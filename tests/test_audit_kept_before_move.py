"""A host tensor a class keeps as the processor returned it, while the same function sends a device copy on.

A VLM driver keeps the image grid (`self.grid = thw`) and passes `thw.to(device)` to the prefill; the step then
recomputes the rope delta from the kept grid with `.tolist()` each step. The kept tensor is host memory on a GPU
too (the processor made it, in another module), so the read waits for nothing; a CPU scan used to report it as a
host-sync. Keeping the moved copy (`self.grid = thw.to(device)`, or `thw = thw.to(device)` first) is a real read.
"""

from __future__ import annotations

import random

import pytest

from site_util import SEEDED_TARGET, at, blocking, install_library, table, write_target

PROCESSOR = """
import torch


class Batch(dict):
    def to(self, device):
        for k in list(self):
            self[k] = self[k].to(device)
        return self


def process(h, w):
    ids = torch.randint(3, 100, (1, 4 + h * w // 4))
    return ids, torch.tensor([[1, h, w]])


def process_batch(h, w):
    ids, grid = process(h, w)
    return Batch(input_ids=ids, image_grid_thw=grid)
"""

KEEPS = {
    "kept": ("ids, thw = process({h}, {w})", "self.{attr} = thw", "self.prefill(ids.to(device), thw.to(device))"),
    "batch": ("inputs = process_batch({h}, {w})", "self.{attr} = inputs[\"image_grid_thw\"]",
              "inputs.to(device); self.prefill(inputs[\"input_ids\"], inputs[\"image_grid_thw\"])"),
    "moved": ("ids, thw = process({h}, {w})", "self.{attr} = thw.to(device)", "self.prefill(ids.to(device), thw.to(device))"),
    "rebound": ("ids, thw = process({h}, {w}); thw = thw.to(device)", "self.{attr} = thw",
                "self.prefill(ids.to(device), thw)"),
}

TARGET = """
import torch
from {mod} import process, process_batch


""" + SEEDED_TARGET + """        {bind}
        {keep}
        {use}

    def prefill(self, ids, grid):
        self.n = ids.shape[1] + int(grid.sum())

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        t, h, w = self.{attr}[0].tolist()  # SITE
        self.out.copy_(self.x @ self.w * (max(h, w) // 2 - t))
        return self.out


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("kind", list(KEEPS))
def test_grid_kept_before_its_move(tmp_path, monkeypatch, kind):
    mod, _ = install_library(tmp_path, monkeypatch, PROCESSOR, prefix="proc")
    h, w = random.choice([2, 4, 6]), random.choice([2, 4, 8])
    attr = random.choice(["image_grid_thw", "grid", "thw_kept"])
    bind, keep, use = (s.format(h=h, w=w, attr=attr) for s in KEEPS[kind])
    path, site = write_target(tmp_path / "target" / "vlm_grid.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), attr=attr, bind=bind, keep=keep, use=use)
    bad = blocking(path, forget=mod)
    hits = at(bad, "host-sync", site)
    if kind in ("kept", "batch"):
        assert not len(bad), table(bad)
    else:
        assert len(hits) == 1, table(bad)
