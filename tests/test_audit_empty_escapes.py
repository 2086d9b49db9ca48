"""Tensors with no elements carry no data across steps: an empty padding slot is no silent corruption.

A streaming conv stack keeps one padding slot per layer and rebuilds a layer's slot every call (transformers'
MimiConv1dPaddingCache: `torch.empty(B, C, 0)` for a layer without left context, `hidden[:, :, -pad:]` for
the others). Both escape into the next step, but a replay reading zero elements at the captured address reads
nothing: only the non-empty slot is a step-allocation. Likewise an empty tensor rebound in prepare() is no
stale input pointer, while a rebound non-empty one is."""

from __future__ import annotations

import random

from site_util import at, blocking, marked_line, table, write_target

SLOTS = """
import torch

C, T, PAD = {c}, {t}, {pad}


class Target:
    def __init__(self):
        self.x = torch.zeros(1, C, T)
        self.y = torch.zeros(1, C, 2 * T + PAD)
        self.slots = [torch.zeros(1, C, PAD), torch.empty(1, C, 0)]

    def prepare(self, i):
        self.x.copy_(torch.randn(1, C, T))

    @torch.no_grad()
    def step(self):
        h = torch.tanh(self.x)  # FULL
        y0 = torch.cat([self.slots[0], h], dim=-1)
        {keep}
        y1 = torch.cat([self.slots[1], h], dim=-1)
        self.slots[1] = torch.empty(1, C, 0)  # EMPTY
        self.y.copy_(torch.cat([y0, y1], dim=-1))
        return self.y


def make(device):
    return Target()
"""

REBOUND = """
import torch

C, T = {c}, {t}


class Target:
    def __init__(self):
        self.x = torch.zeros(1, C, T)
        self.pad = torch.zeros(1, C, {width})
        self.y = torch.zeros(1, C, T + {width})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, C, T))
        self.pad = torch.zeros(1, C, {width})

    @torch.no_grad()
    def step(self):
        self.y.copy_(torch.cat([self.pad, self.x], dim=-1))  # SITE
        return self.y


def make(device):
    return Target()
"""


def _fields():
    return dict(c=random.choice([2, 4, 8]), t=random.choice([4, 6, 8]), pad=random.choice([1, 2, 3]))


def test_an_empty_slot_rebuilt_every_step_is_no_escape_beside_a_real_one(tmp_path):
    path, _ = write_target(tmp_path / f"slots_{random.randrange(10**6)}.py", SLOTS,
                           keep="self.slots[0] = h[..., -PAD:]", marker="# FULL", **_fields())
    bad = blocking(path)
    assert len(at(bad, "step-allocation", marked_line(path, "# FULL"))) == 1, table(bad)
    assert at(bad, "step-allocation", marked_line(path, "# EMPTY")).empty, table(bad)


def test_slots_updated_in_place_and_an_empty_slot_are_graph_ready(tmp_path):
    path, _ = write_target(tmp_path / f"slots_inplace_{random.randrange(10**6)}.py", SLOTS,
                           keep="self.slots[0].copy_(h[..., -PAD:])", marker="# FULL", **_fields())
    bad = blocking(path)
    assert bad.empty, table(bad)


def test_an_empty_input_rebound_in_prepare_is_no_stale_pointer(tmp_path):
    path, site = write_target(tmp_path / f"rebound_empty_{random.randrange(10**6)}.py", REBOUND, width=0,
                              **_fields())
    bad = blocking(path)
    assert bad.empty, table(bad)


def test_a_non_empty_input_rebound_in_prepare_is_still_a_stale_pointer(tmp_path):
    path, site = write_target(tmp_path / f"rebound_full_{random.randrange(10**6)}.py", REBOUND,
                              width=random.choice([1, 2, 3]), **_fields())
    bad = blocking(path)
    assert len(at(bad, "stale-input-pointer", site)) == 1, table(bad)
