"""A loop index inside an inner loop that a conditional `break` cuts short is the break's finding, not a baked value.

A verifier walks each sequence's drafted tokens in Python (`for b in range(B): for j in range(K):`) and stops at
the first rejection (`if ok: ... else: break`). Each outer iteration then runs the inner loop a data-dependent
number of times, so the k-th run of `self.draft[b, j]` is another (b, j) pair in another step: the `if` that
breaks is reported (host-sync, data-dependent-control), the index lines are not baked values. A line in the same
loop that reads a Python counter the step advances stays baked; the device-side twin has no finding at all.
"""

from __future__ import annotations

import random

from site_util import at, blocking, marked_line, table, write_target

TARGET = """
import torch

B, K, V = {b}, {k}, 64


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.draft = torch.zeros(B, K, dtype=torch.long)
        self.ok = torch.zeros(B, K, dtype=torch.bool)
        self.table = torch.randn(K, V)
        self.out = torch.full((B, K), -1, dtype=torch.long)
        self.pos = 0

    def prepare(self, i):
        self.draft.copy_(torch.randint(0, V, (B, K)))
        lens = torch.randint(0, K, (B,))
        lens[0] = i % K  # the first sequence stops somewhere else every step
        self.ok.copy_(torch.arange(K)[None] < lens[:, None])

    @torch.no_grad()
    def step(self):
        self.pos += 1
        out = []
        for b in range(B):
            for j in range(K):
                tok = self.draft[b, j]  # INDEX
                bias = {bias}  # BIAS
                if self.ok[b, j]:  # GUARD
                    out.append(tok + bias)
                else:
                    break
        return out
{clean}

def make(device):
    return {cls}()
"""

CLEAN = """

class Clean(Target):
    def step(self):
        accepted = self.ok.int().cumprod(dim=1).bool()
        self.out.copy_(torch.where(accepted, self.draft, torch.full_like(self.draft, -1)))
        return self.out
"""


def _write(tmp_path, name, bias="self.table[j, 0].long()", cls="Target"):
    path, guard = write_target(tmp_path / name, TARGET, marker="# GUARD", b=random.choice([2, 3]),
                               k=random.choice([4, 5]), seed=random.randrange(2**31), bias=bias,
                               clean=CLEAN if cls == "Clean" else "", cls=cls)
    return path, guard


def test_an_index_of_a_loop_cut_by_break_is_not_baked(tmp_path):
    path, guard = _write(tmp_path, "verify_loop.py")
    bad = blocking(path)
    assert len(at(bad, "host-sync", guard)) == 1, table(bad)
    assert len(at(bad, "data-dependent-control", guard)) == 1, table(bad)
    for line in (marked_line(path, "# INDEX"), marked_line(path, "# BIAS"), guard):
        assert not len(at(bad, "baked-host-value", line)), table(bad)


def test_a_counter_read_in_the_cut_loop_stays_baked(tmp_path):
    path, _ = _write(tmp_path, "verify_counter.py", bias="self.table[self.pos % K, 0].long()")
    bad = blocking(path)
    assert len(at(bad, "baked-host-value", marked_line(path, "# BIAS"))) == 1, table(bad)


def test_the_masked_twin_is_clean(tmp_path):
    path, _ = _write(tmp_path, "verify_masked.py", cls="Clean")
    bad = blocking(path)
    assert not len(bad), table(bad)
