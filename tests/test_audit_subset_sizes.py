"""A size read off a varying tensor stays downstream when only some of the steps are compared.

A vision model's rotary table (timm's EVA `build_rotary_pos_embed`) makes `torch.arange(h)` and `torch.arange(w)`
from the patch grid read off `x.shape`, then `torch.meshgrid` expands each to `(h, w)`. With images cropped to a
per-request (h, w), two steps with the same h hand that expand the same input shape and another w: the
baked-host-value check compares those steps alone, and the size check then asked for earlier calls with exactly
as many steps as it compared, so none matched and the grid's line read as a baked value beside the crop's.
Sized from the grid, the expand is downstream; sized from host numbers the caller passes, it stays reported.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import torch


def rope_grid(x):
    h, w = x.shape[-2:]
    return grid_of(h, w)


def grid_of(h, w):
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")  # LIBSITE
    return torch.stack([ys, xs], -1).float()
"""

TARGET = """
import torch
import {mod} as lib

SIZES = {sizes}


class Target:
    def __init__(self):
        self.buf = torch.zeros(1, {hmax}, {hmax})
        self.out = torch.zeros(2)
        self.h, self.w = SIZES[0]

    def prepare(self, i):
        self.h, self.w = SIZES[i % len(SIZES)]
        self.buf.normal_()

    def step(self):
        x = self.buf[:, : self.h, : self.w]  # CROP
        g = {call}  # SITE
        self.out.copy_((g * x[0, :, :, None]).sum((0, 1)))
        return self.out


def make(device):
    return Target()
"""


def _sizes() -> list:
    """Six steps (two warmup, four audited): the audited ones pair each height with two widths and back, so some
    steps share the expand's input shape and not its size."""
    h1, h2 = random.sample(range(3, 8), 2)
    w1, w2 = random.sample(range(3, 8), 2)
    audited = [(h1, w1), (h1, w2), (h2, w1), (h2, w2)]
    random.shuffle(audited)
    return [(h2, w2), (h1, w1)] + audited


@pytest.mark.parametrize("source", ["grid", "host"])
def test_an_expand_sized_from_a_varying_grid_is_downstream_in_any_steps(tmp_path, monkeypatch, source):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="ropes")
    call = "lib.rope_grid(x)" if source == "grid" else "lib.grid_of(self.h, self.w)"
    path, site = write_target(tmp_path / "target" / "rope_target.py", TARGET, mod=mod, sizes=_sizes(), hmax=8,
                              call=call)
    bad = blocking(path, forget=mod)
    crop = marked_line(path, "# CROP")
    assert {"dynamic-shape", "baked-host-value"} <= set(bad[bad.line == crop].category), table(bad)
    grid = bad[(bad.line == marked_line(lib, "# LIBSITE")) & (bad.category == "baked-host-value")]
    if source == "grid":
        assert not len(grid), table(bad)
    else:  # host numbers read off no tensor: where they enter the grid, they are baked
        assert len(grid) and (grid.caller_line == site).all(), table(bad)
