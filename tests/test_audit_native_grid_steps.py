"""A position table resampled only when the image's patch grid is not the table's own: the shape varies, nothing else.

timm's `resample_abs_pos_embed` returns the table untouched when the grid read off the image (`B, H, W, C =
x.shape`) is the table's own and interpolates it otherwise. A stream whose frames sometimes have the model's native
size therefore (a) skips the interpolation in those steps: a branch decided by sizes alone, one path per shape,
no data-dependent-control; (b) interpolates to the grid in the other steps, whose sizes follow the patch grid
(neither a dynamic-shape nor a baked-host-value there, though that call ran in fewer steps than the patch
embedding); (c) adds the table to the tokens, which is the parameter itself in the native steps (read from
outside the step, one shape) and the step-made copy in the rest: downstream, no origin. The image's own varying
shape stays reported at the patch embedding. A test that mixes a host counter into a size (`tick % 2 == 0 and H > 1`,
`tick` the step's `self.n`) is still a branch.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import torch
import torch.nn.functional as F


def resample(posemb, new_size, old_size, num_prefix=0):
    total = new_size[0] * new_size[1] + num_prefix
    if total == posemb.shape[1]:  # SIZEBRANCH
        if old_size[0] == new_size[0]:
            return posemb
    g = posemb.reshape(1, old_size[0], old_size[1], -1).permute(0, 3, 1, 2)
    g = F.interpolate(g, size=new_size, mode="bilinear")  # INTERP
    return g.permute(0, 2, 3, 1).reshape(1, -1, posemb.shape[-1])


class Tower(torch.nn.Module):
    def __init__(self, dim=8, patch=4, grid=4):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, dim, patch, patch)
        self.grid = (grid, grid)
        self.pos = torch.nn.Parameter(torch.randn(1, grid * grid, dim))

    def forward(self, img, tick=None):
        x = self.proj(img).permute(0, 2, 3, 1)  # PATCH
        B, H, W, C = x.shape
        pos = resample(self.pos, new_size=(H, W), old_size=self.grid)
        if tick is not None and tick % 2 == 0 and H > 1:  # COUNTERBRANCH
            x = x * 2
        return (x.reshape(B, -1, C) + pos).sum(-1)  # ADD
"""

TARGET = """
import torch
import {mod} as lib

SIZES = {sizes}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.tower = lib.Tower()
        self.n = 0
        self.img = torch.zeros(1, 3, 16, 16)

    def prepare(self, i):
        h, w = SIZES[i % len(SIZES)]
        self.img = torch.randn(1, 3, 4 * h, 4 * w)

    @torch.no_grad()
    def step(self):
        if {counter}:
            self.n += 1
            return self.tower(self.img, self.n)
        return self.tower(self.img)  # SITE


def make(device):
    return Target()
"""


def _sizes():
    """Six grids, the rest not square, and the table's own 4x4 at one of the audited steps (2 to 5)."""
    out = []
    while len(out) < 5:
        h, w = random.sample(range(2, 9), 2)
        if (h, w) not in out:
            out.append((h, w))
    out.insert(random.randrange(2, 6), (4, 4))
    return out


@pytest.mark.parametrize("counter", [False, True])
def test_native_grid_steps_follow_the_image(tmp_path, monkeypatch, counter):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="nativelib")
    path, _ = write_target(tmp_path / "target" / "native_target.py", TARGET, mod=mod, sizes=_sizes(),
                           seed=random.randrange(1000), counter=counter)
    bad = blocking(path, forget=mod)
    patch, interp, add = (marked_line(lib, m) for m in ("# PATCH", "# INTERP", "# ADD"))
    control = bad[bad.category == "data-dependent-control"]
    assert set(bad[bad.category == "dynamic-shape"].line) & {patch}, table(bad)
    if counter:  # the host counter picks the arm: a branch
        assert marked_line(lib, "# COUNTERBRANCH") in set(control.line), table(bad)
    else:
        assert control.empty, table(bad)
        assert bad[bad.line.isin([interp, add]) & bad.category.isin(["dynamic-shape", "baked-host-value"])].empty, \
            table(bad)


ROUTED = """
import torch


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.router = torch.eye({d})[:, :{e}] * 10
        self.experts = [torch.randn({d}, {d}) for _ in range({e})]
        self.x = torch.zeros({t}, {d})
        self.k = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.rand({t}, {d}))
        self.x[:, (i + 1) // 2 % {e}] += 10  # every token to one expert, the same one two steps running

    def rows_of(self, choice, e):
        return {rows}

    @torch.no_grad()
    def step(self):
        self.k = torch.cat([self.k, self.x[:1]], 0)  # a cache that grows: inputs of another shape each step
        h = self.x + (self.x @ self.k.T).softmax(-1) @ self.k * 0.01
        choice = (self.x @ self.router).argmax(-1)
        out = torch.zeros_like(h)
        for e in range({e}):
            rows = self.rows_of(choice, e)
            if {test}:  # SITE
                continue
            out[rows] = h[rows] @ self.experts[e]
        return out


def make(device):
    return Target()
"""


def test_a_size_made_from_data_stays_a_branch_beside_a_growing_cache(tmp_path):
    """An MoE step skips the experts no token chose (`if rows.numel() == 0: continue`, rows from a `nonzero`) while
    its KV cache grows: the inputs' shapes vary too, yet the tested size came from the routing, not the inputs. The
    expert weights the k-th matmul reads differ between steps that skipped different experts, which is that
    branch's doing: where two steps made the same calls up to the read, they read the same expert."""
    path, site = write_target(tmp_path / "routed_target.py", ROUTED, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), e=random.choice([4, 6]), t=random.choice([4, 6]),
                              rows=random.choice(["(choice == e).nonzero().squeeze(-1)",
                                                  "torch.nonzero(choice == e)[:, 0]"]),
                              test=random.choice(["rows.shape[0] == 0", "rows.numel() == 0", "len(rows) == 0"]))
    bad = blocking(path)
    assert site in set(bad[bad.category == "data-dependent-control"].line), table(bad)
    assert not (bad.category == "stale-input-pointer").any(), table(bad)  # the experts are never rebound
