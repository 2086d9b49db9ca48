"""Host snapshots kept member by member in a dict attribute, restored into device states in the step.

A prefix cache snapshots a sequence's state with `self.snaps[k] = self.states[k].cpu()` (the dict starts
empty, `self.snaps = {}`) and restores a hit with `self.states[0].copy_(self.snaps[k])`: on a GPU that copy
reads pageable memory, which capture refuses. The source said nothing of the dict as a whole, and the
destination, a member of a dict the class fills with `torch.zeros(..., device=device)`, was not known as a
device tensor, so a CPU scan reported nothing. Members count by the stores into the container; a snapshot
kept on the device (`.clone()`) is clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch


class PrefixCache:
    def __init__(self, d, device, n):
        self.{states} = {{i: torch.zeros(1, d, device=device) for i in range(n)}}
        self.snaps = {{}}

    def snapshot(self, k):
        self.snaps[k] = self.{states}[k]{move}

    def restore(self, x, k):
        self.{states}[0].copy_(self.snaps[k])  # LIBSITE
        return x + self.{states}[0]
"""


@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_host_snapshot_restored_into_a_device_state(tmp_path, monkeypatch, kind):
    move = random.choice([".cpu()", '.to("cpu")', ".detach().cpu()"]) if kind == "hit" else ".clone()"
    n = random.randint(2, 4)
    k = random.randint(1, n - 1)
    src = LIB.format(states=random.choice(["states", "slots"]), move=move)
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "snaps", "PrefixCache",
                                          f"self.pc.restore(self.x @ self.w, {k})",
                                          init=f"        self.pc = PrefixCache({{d}}, self.x.device, {n})\n"
                                               f"        self.pc.snapshot({k})")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "pageable-copy", lib, path, site)
