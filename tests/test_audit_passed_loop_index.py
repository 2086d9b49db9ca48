"""A skipped loop's index handed to a helper is the skip's finding, not a baked value at the helper.

An MoE expert loop skips idle experts (`if rows.numel() == 0: continue`) and hands the expert id to a
helper that indexes stacked weights (`forward_one(e, x)` reading `self.w1[e]`). The k-th run of the
helper's line is another expert in another step only because a different expert was skipped: the
guard is reported (data-dependent-control), the helper's index is not. A helper handed a Python value
that really changes per step (a position) is still a baked value at the helper's line.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, marked_line, table, write_target

TARGET = """
import torch

E, D = 4, {d}


def pick(w, e):
    return w[e]  # PICKED


class Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(E, D, D) * 0.1)

    def forward_one(self, e, x):
        {body}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.experts = Experts()
        self.x = torch.zeros(6, D)
        self.route = torch.zeros(6, dtype=torch.long)
        self.out = torch.zeros(6, D)
        self.pos = 0

    def prepare(self, i):
        self.x.copy_(torch.randn(6, D))
        skip = i % E
        others = [e for e in range(E) if e != skip]
        self.route.copy_(torch.tensor([others[j % 3] for j in range(6)]))

    @torch.no_grad()
    def step(self):
        out = torch.zeros_like(self.x)
        self.pos += 1
        for e in range(E):
            rows = (self.route == e).nonzero().squeeze(-1)
            if rows.numel() == 0:  # GUARD
                continue
            y = self.experts.forward_one({arg}, self.x[rows])  # CALL
            out.index_add_(0, rows, y)
        self.out.copy_(out)


def make(device):
    return Target()
"""

BODIES = {
    "direct": "return x @ self.w[e]  # HELPER",
    "nested": "return x @ pick(self.w, e)",
}


@pytest.mark.parametrize("body", sorted(BODIES))
@pytest.mark.parametrize("kw", [False, True])
def test_a_skipped_index_passed_to_a_helper_is_not_baked(tmp_path, body, kw):
    arg = "e=e, x=" if kw else "e, "
    path, guard = write_target(tmp_path / "moe_passed.py", TARGET.replace("{arg}, ", arg), marker="# GUARD",
                               body=BODIES[body], d=random.choice([4, 8]), seed=random.randrange(2**31))
    bad = blocking(path)
    helper = marked_line(path, "# HELPER" if body == "direct" else "# PICKED")
    assert len(at(bad, "data-dependent-control", guard)) == 1, table(bad)
    assert not len(at(bad, "baked-host-value", helper)), table(bad)


def test_a_changing_position_passed_to_a_helper_stays_baked(tmp_path):
    path, guard = write_target(tmp_path / "moe_pos.py", TARGET.replace("{arg}", "self.pos % E"), marker="# GUARD",
                               body=BODIES["direct"], d=4, seed=random.randrange(2**31))
    bad = blocking(path)
    assert len(at(bad, "baked-host-value", marked_line(path, "# HELPER"))) == 1, table(bad)


SLOTS = """
import torch

V, D, S = 64, {d}, 6


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.table = torch.randn(V, D)
        self.cache = torch.zeros(S, D)
        self.where = {{}}
        self.free = list(range(S))
        self.ids = torch.zeros(4, dtype=torch.long)
        self.out = torch.zeros(4, D)

    def prepare(self, i):
        self.ids.copy_(torch.tensor({ids}))

    @torch.no_grad()
    def step(self):
        for k in self.ids.tolist():
            if k in self.where:
                continue
            slot = self.free.pop() if self.free else self.where.pop(next(iter(self.where)))
            self.cache[{index}].copy_(self.table[k])  # FILL
            self.where[k] = slot
        self.out.copy_(self.cache[:4])


def make(device):
    return Target()
"""


@pytest.mark.parametrize("index", ["slot", "k % S"])
def test_a_host_slot_beside_the_skipped_index_is_baked(tmp_path, index):
    """`cache[slot].copy_(table[k])` in a loop over ids that skips known ids: the line reads the loop's `k`, but
    the index the device op takes is `slot`, a host value of its own: baked whatever the skip. Indexing the cache
    with the loop's value itself is the skip's (data-dependent-control) alone."""
    base = random.randrange(V := 64)
    # one unseen id on even steps, two on odd ones: the steps run the fill line a different number of times
    ids = f"[{base}, ({base} + 1 + 2 * i) % V, {base}, ({base} + 2 + 2 * i) % V if i % 2 else {base}]"
    path, fill = write_target(tmp_path / "slots.py", SLOTS, marker="# FILL", index=index, ids=ids,
                              d=random.choice([4, 8]), seed=random.randrange(2**31))
    bad = blocking(path)
    assert len(bad[bad.category == "data-dependent-control"]), table(bad)  # the skip is seen
    assert len(at(bad, "baked-host-value", fill)) == (index == "slot"), table(bad)
