"""A changing host value or shape made on a library line reached from two of the target's lines is one
finding per calling line.

A rotary helper (rotary_embedding_torch's `rotate_queries_or_keys(t, offset=pos)`) adds the Python offset to an
`arange` on one line of its own, and a decode step calls it for the queries and again for the keys: each call
is a place to fix (pass a device position there). The baked-host-value and dynamic-shape rules grouped the
aligned calls by the library line alone, so only the first caller was named and fixing it hid the second.
So did step-allocation for a cache grown by one library helper (torch_einops_utils' `safe_cat([self.k, k])`
and `safe_cat([self.v, v])`): one escape was reported, holding `v`, at the keys' line.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import torch


def rotate(t, offset=0):
    pos = torch.arange(t.shape[-2], dtype=t.dtype) + offset  # LIBSITE value
    ang = pos[:, None] * torch.linspace(0.1, 1.0, t.shape[-1])
    return t * ang.cos() + t.flip(-1) * ang.sin()


def window(t, n):
    return t[..., :n, :]  # LIBSITE shape


def grow(cache, new):
    return torch.cat((cache, new))  # LIBSITE escape
"""

TARGET = """
import torch
from {mod} import rotate, window

D = {d}


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.wq = torch.randn(D, D, generator=g)
        self.wk = torch.randn(D, D, generator=g)
        self.x = torch.zeros(1, D)
        self.table = torch.randn(1, 32, D, generator=g)
        self.out = torch.zeros(1, D)
        self.pos = {start}

    def prepare(self, i):
        self.x.copy_(torch.randn(1, D))
        self.pos = {start} + i * {stride}

    def step(self):
        {first}  # FIRST
        {second}  # SECOND
        self.out.copy_(a.sum(0) + b.sum(0))
        return self.out
"""

CALLS = {
    "value": ("a = rotate((self.x @ self.wq)[None], offset=self.pos)[0]",
              "b = rotate((self.x @ self.wk)[None], offset=self.pos)[0]"),
    "shape": ("a = window(self.table, self.pos)[0]", "b = window(self.table * 2, self.pos)[0]"),
    "fixed": ("a = rotate((self.x @ self.wq)[None], offset=3)[0]", "b = rotate((self.x @ self.wk)[None], offset=3)[0]"),
}
CATEGORY = {"value": "baked-host-value", "shape": "dynamic-shape"}


@pytest.mark.parametrize("kind", ["value", "shape", "fixed"])
def test_each_calling_line_of_a_library_value_is_a_finding(tmp_path, monkeypatch, kind):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="rotaryutil")
    first, second = CALLS[kind]
    path, _ = write_target(tmp_path / "target" / "two_rotations.py", TARGET + "\n\ndef make(device):\n    return Target()\n",
                           marker="# FIRST", mod=mod, seed=random.randrange(2**31), d=random.choice([4, 8, 16]),
                           start=random.randrange(2, 6), stride=random.choice([1, 2, 3]), first=first, second=second)
    bad = blocking(path, forget=mod)
    if kind == "fixed":
        assert not len(bad), table(bad)
        return
    site = marked_line(lib, f"# LIBSITE {kind}")
    hits = bad[(bad.category == CATEGORY[kind]) & bad.file.str.endswith(lib.name) & (bad.line == site)]
    callers = {marked_line(path, "# FIRST"), marked_line(path, "# SECOND")}
    assert set(hits.caller_line.astype(int)) == callers and len(hits) == 2, table(bad)


ESCAPE = """
import torch
from {mod} import grow

D = {d}


class Target:
    def __init__(self):
        self.x = torch.zeros(1, D)
        self.k = torch.zeros({n}, D)
        self.v = torch.zeros({n}, D)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, D))

    def step(self):
        self.k = grow(self.k, self.x * 2)  # FIRST
        self.v = grow(self.v, self.x + 1)  # SECOND
        return (self.k * self.v).sum(0)


def make(device):
    return Target()
"""


def test_each_calling_line_of_a_library_escape_is_a_finding(tmp_path, monkeypatch):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="growutil")
    path, _ = write_target(tmp_path / "target" / "two_caches.py", ESCAPE, marker="# FIRST", mod=mod,
                           d=random.choice([4, 8, 16]), n=random.randrange(1, 5))
    bad = blocking(path, forget=mod)
    site = marked_line(lib, "# LIBSITE escape")
    hits = bad[(bad.category == "step-allocation") & bad.file.str.endswith(lib.name) & (bad.line == site)]
    callers = {marked_line(path, "# FIRST"): "`k`", marked_line(path, "# SECOND"): "`v`"}
    assert set(hits.caller_line.astype(int)) == set(callers) and len(hits) == 2, table(bad)
    for _, h in hits.iterrows():  # each names the attribute its own call rebinds
        assert callers[int(h.caller_line)] in h.message, table(bad)
