"""data-dependent-control: a fixed-trip loop whose body's `if` picks the rows is one finding, at the `if`.

A recurrent decode resetting finished rows one by one (`for b in range(B): if self.done[b]:
self.state[b].zero_()`) runs other zero_() calls in other steps. The alignment of two steps' ops cuts
across the loop when the reset rows sit in other iterations, so the `for` line used to be blamed beside
the `if`. The `if`'s test ran once per iteration, equally often in every step, so the loop's trip count
did not decide: the loop's finding folds into the `if`'s (the host-sync of `bool(self.done[b])` stands).
A loop whose trip count moves (`range(self.n_active)`, set by prepare()) keeps its own finding, and the
graph-safe twin (a masked multiply) has none.
"""

from __future__ import annotations

import random

from site_util import blocking, marked_line, table, write_target

HEAD = """
import torch

B, N = {b}, {n}
PATTERN = {pattern}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.state = torch.zeros(B, N, N)
        self.done = torch.zeros(B, dtype=torch.bool)
        self.k = torch.zeros(B, N)
        self.n_active = B

    def prepare(self, i):
        self.done.copy_(torch.tensor(PATTERN[i % len(PATTERN)][:B]))  # the rows finishing this step
        self.k.copy_(torch.randn(B, N))
"""

LOOP_IF = HEAD + """
    def step(self):
        for b in range(B):  # LOOP
            if self.done[b]:  # SITE
                self.state[b].zero_()
        self.state.mul_(0.9).add_(self.k.unsqueeze(-1) * self.k.unsqueeze(-2))
        return self.state.sum()


def make(device):
    return Target()
"""

MOVING_TRIPS = HEAD.replace("    def prepare(self, i):\n",
                            "    def prepare(self, i):\n        self.n_active = 1 + i % B\n") + """
    def step(self):
        for b in range(self.n_active):  # LOOP
            if self.done[b]:  # SITE
                self.state[b].zero_()
            self.state[b].mul_(0.9)
        return self.state.sum()


def make(device):
    return Target()
"""

CLEAN = HEAD + """
    def step(self):
        self.state.mul_((~self.done).to(self.state.dtype)[:, None, None])  # SITE
        self.state.mul_(0.9).add_(self.k.unsqueeze(-1) * self.k.unsqueeze(-2))
        return self.state.sum()


def make(device):
    return Target()
"""


# which rows finish in consecutive steps: another row, another count, or the rows interleaved (each makes the
# alignment of two steps cut across the loop somewhere)
PATTERNS = ("[[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0]]",
            "[[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]",
            "[[1, 0, 1, 0, 1], [0, 1, 0, 1, 0]]",
            "[[0, 1, 0, 0, 0], [1, 0, 0, 0, 0]]",
            "[[1, 0, 0, 0, 0], [0, 0, 1, 0, 0]]")


def _fields():
    return dict(seed=random.randrange(10**6), b=random.choice([3, 4, 5]), n=random.choice([4, 6, 8]),
                pattern=random.choice(PATTERNS))


def test_fixed_trip_loop_folds_into_its_if(tmp_path):
    path, site = write_target(tmp_path / "reset_rows.py", LOOP_IF, **_fields())
    bad = blocking(path)
    control = bad[bad.category == "data-dependent-control"]
    assert set(control.line.astype(int)) == {site}, table(bad)
    assert ((bad.line == site) & (bad.category == "host-sync")).any(), table(bad)


def test_moving_trip_count_keeps_the_loops_finding(tmp_path):
    path, site = write_target(tmp_path / "reset_active_rows.py", MOVING_TRIPS, **_fields())
    bad = blocking(path)
    control = bad[bad.category == "data-dependent-control"]
    assert marked_line(path, "# LOOP") in set(control.line.astype(int)), table(bad)


def test_masked_reset_twin_is_graph_ready(tmp_path):
    path, _ = write_target(tmp_path / "reset_masked.py", CLEAN, **_fields())
    bad = blocking(path)
    assert bad.empty, table(bad)
