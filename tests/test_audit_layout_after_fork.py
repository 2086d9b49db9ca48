"""A reshape that is a `view` after one arm of a branch and a `clone` after the other is the branch's fork.

An fla-style gated-delta-rule layer picks its reference kernel by a context length the host keeps: the chunked
one past a bound, the recurrent one before. One arm returns a contiguous output, the other a transposed view of
the same shape, so the following `o.reshape(B, -1)` runs torch's `view` in one step and `clone` +
`_unsafe_view` in the next: the `if` is the one place to act; the reshape was reported as a second fork.
"""

from __future__ import annotations

import random

from site_util import at, blocking, marked_line, table, write_target

TARGET = """
import torch

B, H, K = {b}, {h}, {k}


def recurrent(q, state):
    return (q[:, :, None, :] * state).sum(2)              # [B, H, K], contiguous


def chunked(q, state):
    return torch.einsum("bhk,bhkv->bvh", q, state).contiguous().transpose(1, 2)  # [B, H, K], transposed


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.state = torch.randn(B, H, K, K)
        self.q = torch.zeros(B, H, K)
        self.w = torch.randn(H * K, H * K)
        self.out = torch.zeros(B, H * K)
        self.ctx = 0

    def prepare(self, i):
        self.q.normal_()
        self.ctx = {start} + i

    def step(self):
        if self.ctx > {bound}:  # SITE
            o = chunked(self.q, self.state)
        else:
            o = recurrent(self.q, self.state)
        self.state.mul_({decay})
        self.out.copy_(o.reshape(B, -1) @ self.w)  # RESHAPE
        return self.out


def make(device):
    return Target()
"""


def test_a_reshape_picking_view_or_clone_after_a_branch_is_not_a_second_fork(tmp_path):
    start = random.randrange(10, 100)
    bound = start + random.choice([3, 4])  # the audited steps (i = 2..5) cross it
    path, line = write_target(tmp_path / "layout_after_fork.py", TARGET, b=random.choice([1, 2]), h=random.choice([2, 4]),
                              k=random.choice([4, 8]), seed=random.randrange(2**31), start=start, bound=bound,
                              decay=random.choice([0.9, 0.99, 0.999]))
    bad = blocking(path)
    forks = bad[bad.category == "data-dependent-control"]
    assert len(at(forks, "data-dependent-control", line)) == 1, table(bad)
    assert not len(at(forks, "data-dependent-control", marked_line(path, "# RESHAPE"))), table(bad)
