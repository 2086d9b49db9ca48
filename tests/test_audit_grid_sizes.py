"""Each varying size of a call is matched on its own against the earlier varying shapes it was read from.

A vision transformer at native resolution (timm's `dynamic_img_size`) reads its patch grid as `B, H, W, C =
x.shape` and interpolates the position table to `(H, W)` in a helper. The image's shape varies (an input of
another size each step), so the interpolation's height and width vary too, each one following one dimension
of the patch grid: downstream of the image's dynamic shape, not a second origin (neither a dynamic-shape nor a
baked-host-value at the interpolation). The same interpolation sized from host numbers that prepare() sets
(`self.hw`), read off no tensor, stays an origin of its own with its baked value.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import torch
import torch.nn.functional as F


def resample(posemb, new_size):
    posemb = posemb.permute(0, 3, 1, 2)
    posemb = F.interpolate(posemb, size=new_size, mode="bilinear")  # INTERP
    return posemb.permute(0, 2, 3, 1)


class Tower(torch.nn.Module):
    def __init__(self, dim=8, patch=4):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, dim, patch, patch)
        self.pos = torch.nn.Parameter(torch.randn(1, 4, 4, dim))

    def forward(self, img, hw=None):
        x = self.proj(img).permute(0, 2, 3, 1)  # PATCH
        B, H, W, C = x.shape
        if hw is None:
            pos = resample(self.pos, new_size=(H, W))
        else:
            pos = resample(self.pos, new_size=hw)  # the host's numbers, read off no tensor
        return (x + pos).reshape(B, -1, C)
"""

TARGET = """
import torch
import {mod} as lib

SIZES = {sizes}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.tower = lib.Tower()
        self.hw = None
        self.img = torch.zeros(1, 3, 32, 32)

    def prepare(self, i):
        h, w = SIZES[i % len(SIZES)]
        if {host}:  # a static canvas, cropped in the step to the host's size
            self.hw = (h, w)
            self.img.normal_()
        else:  # an image of its own size
            self.img = torch.randn(1, 3, 4 * h, 4 * w)

    @torch.no_grad()
    def step(self):
        img = self.img if self.hw is None else self.img[:, :, : 4 * self.hw[0], : 4 * self.hw[1]]
        return self.tower(img, self.hw)  # SITE


def make(device):
    return Target()
"""


def _sizes():
    out = []
    while len(out) < 6:
        h, w = random.sample(range(2, 9), 2)  # never square, and no two steps alike
        if (h, w) not in out:
            out.append((h, w))
    return out


@pytest.mark.parametrize("host", [False, True])
def test_grid_read_off_the_image_follows_it(tmp_path, monkeypatch, host):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="towerlib")
    path, _ = write_target(tmp_path / "target" / "grid_target.py", TARGET, mod=mod, sizes=_sizes(),
                           seed=random.randrange(1000), host=host)
    bad = blocking(path, forget=mod)
    patch, interp = marked_line(lib, "# PATCH"), marked_line(lib, "# INTERP")
    shapes = bad[bad.category == "dynamic-shape"]
    at_interp = bad[(bad.line == interp) & bad.category.isin(["dynamic-shape", "baked-host-value"])]
    assert set(shapes.line) & {patch, marked_line(path, "# SITE") - 1}, table(bad)
    if host:  # sizes from host numbers read off no tensor: an origin of their own
        assert set(at_interp.category) == {"dynamic-shape", "baked-host-value"}, table(bad)
    else:
        assert at_interp.empty, table(bad)
