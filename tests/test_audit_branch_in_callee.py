"""data-dependent-control: the branch that chose lives in the function both executions called.

A sliding-window cache (transformers' static sliding layer, a ring buffer) flips from "still filling" to
"full" on a Python counter: one step writes the slot, the next rolls the window. Both steps reached the
cache from the same caller line, inside the caller's own `if cache is not None:`; the paths part inside
`update`, at its `if full:`. That is the statement to name (with the caller's line), not the caller's
enclosing `if`, which both steps entered alike (seen on Mistral's StaticCache, where the caller's `if`
was named).
"""

from __future__ import annotations

import random

from site_util import blocking, install_library, library_hit, matmul_target, write_target

RING = """
import torch


class Ring:
    def __init__(self, cap, d):
        self.cap, self.n = cap, 0
        self.buf = torch.zeros(cap, d)

    def update(self, x):
        full = self.n >= self.cap
        self.n += 1
        if full:  # LIBSITE
            self.buf.copy_(self.buf.roll(-1, 0))
            self.buf[-1:].copy_(x)
        else:
            self.buf.index_copy_(0, torch.tensor([self.n - 1]), x)
        return self.buf.sum(0, keepdim=True)


def ring_or_none(cap, d, on=True):
    return Ring(cap, d) if on else None
"""


def test_the_branch_inside_the_called_function_is_named(tmp_path, monkeypatch):
    cap = random.choice([3, 4])  # warmup 2: the audited steps see the window fill, then roll
    mod, lib = install_library(tmp_path, monkeypatch, RING, prefix="ring")
    tpl = matmul_target(imports=f"from {mod} import ring_or_none",
                        init=f"        self.ring = ring_or_none({cap}, self.w.shape[0])", step="""\
        h = self.x @ self.w
        h = torch.tanh(h)
        if self.ring is not None:
            h = self.ring.update(h)  # SITE
        self.out.copy_(h)
        return self.out""")
    path, site = write_target(tmp_path / "target" / "ring_target.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    library_hit(bad, "data-dependent-control", lib, path, site)
