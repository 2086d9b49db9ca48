"""A counter branch inside an installed library, and one whose test reads the counter through a chain of locals.

transformers' `StaticSlidingWindowLayer.update` advances a Python `cumulative_length_int` and decides with
`current_length = self.cumulative_length_int; is_full = current_length >= self.max_cache_len; if is_full:` whether
to roll the window or index_copy at the position. While the window fills, every audited step takes the copy side;
once it is full eager decode rolls, and a graph captured earlier keeps writing past the window. Such a branch was
looked for only in the target's own functions, and a test reading the counter through two locals was not read
as one. Now a library's branch is reported at its line with the target's call as caller, when running the test
forward shows it turns (a test unreadable there, a size beside the counter, is left alone); an `elif` of a test that
turns is the same decision, not a second finding; a window already full never turns.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

LAYER = """
import torch


class WindowLayer:
    def __init__(self, cap, d, start):
        self.cap = cap
        self.length = start
        self.keys = torch.zeros(cap, d)
        self.pos = torch.zeros(1, dtype=torch.long)

    def update(self, k):
        current = self.length
        full = current >= self.cap
        self.length += 1
        if {test}:  # LIBSITE
            self.keys.copy_(torch.roll(self.keys, -1, 0))
            self.keys[-1:] = k
        elif current + 1 > self.cap:  # ELIF
            self.keys.zero_()
        else:
            self.keys.index_copy_(0, self.pos, k)
            self.pos.add_(1)
        return self.keys
"""

TARGET = """
import torch
{imports}
{layer}

class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.layer = WindowLayer({cap}, {d}, {start})
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros({cap}, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    @torch.no_grad()
    def step(self):
        keys = self.layer.update(torch.tanh(self.x))  # SITE
        self.out.copy_(keys)
        return self.out


def make(device):
    return Target()
"""

CASES = {  # name: (where the layer lives, its test, starts full, reported)
    "library-filling": ("library", "full", False, True),
    "own-filling": ("own", "full", False, True),
    "library-full": ("library", "full", True, False),
    "library-size": ("library", "current + k.shape[0] > self.cap + k.shape[1]", False, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_counter_branch_in_a_library_or_through_locals(tmp_path, monkeypatch, case):
    where, test, starts_full, reported = CASES[case]
    cap, d = random.choice([32, 48, 64]), random.choice([4, 8])
    layer = LAYER.format(test=test)
    fields = dict(seed=random.randrange(2**31), cap=cap, d=d, start=cap + 3 if starts_full else random.randrange(0, 4))
    if where == "library":
        mod, lib = install_library(tmp_path, monkeypatch, layer, prefix="window")
        path, site = write_target(tmp_path / "target" / "window_target.py", TARGET, imports=f"from {mod} import WindowLayer",
                                  layer="", **fields)
        src = lib
    else:
        mod = None
        path, site = write_target(tmp_path / "window_own.py", TARGET, imports="", layer=layer, **fields)
        src = path
    bad = blocking(path, forget=mod)
    hits = bad[(bad.category == "data-dependent-control") & bad.file.str.endswith(src.name)]
    lines = set(hits.line)
    assert (marked_line(src, "# LIBSITE") in lines) == reported, table(bad)
    if test == "full":  # the elif is reached only after `full` turned (or never): no decision of its own
        assert marked_line(src, "# ELIF") not in lines, table(bad)
    if reported and where == "library":
        assert hits.iloc[0].caller_file.endswith(path.name) and int(hits.iloc[0].caller_line) == site, table(hits)
