"""A persistent table picked by a loop index whose iterations a branch skips is no stale input pointer.

Multi-rate codecs (SNAC-style strides) quantize with codebook j only on the frames where `frame % s == 0`:
the first `cdist` of a step reads codebook 1 on even frames and codebook 2 on odd ones, at the same aligned
call. That is the branch's finding (data-dependent-control): the codebooks are never rebound. Two buffers
alternated by a Python parity with no loop stay a stale input pointer."""

from __future__ import annotations

import random

from site_util import at, blocking, marked_line, table, write_target

MULTIRATE = """
import torch

D, BINS = {d}, {bins}
STRIDES = ({coarse}, 2, 1)


class Target:
    def __init__(self):
        self.cbs = [torch.randn(BINS, D) for _ in STRIDES]
        self.z = torch.zeros(1, D)
        self.codes = torch.zeros(len(STRIDES), dtype=torch.long)
        self.frame = 0

    def prepare(self, i):
        self.z.copy_(torch.rand(1, D) * (1 if i % 2 else -1))  # the data decides on alternate frames

    @torch.no_grad()
    def step(self):
        r = self.z
        for j, s in enumerate(STRIDES):
            if {test}:  # BRANCH
                idx = torch.cdist(r, self.cbs[j]).argmin(-1)  # SITE
                r = r - torch.nn.functional.embedding(idx, self.cbs[j])
                self.codes[j:j + 1].copy_(idx)
        self.frame += 1
        return self.codes


def make(device):
    return Target()
"""

PARITY = """
import torch

D = {d}


class Target:
    def __init__(self):
        self.bufs = [torch.zeros(1, D), torch.zeros(1, D)]
        self.x = torch.zeros(1, D)
        self.parity = 0

    def prepare(self, i):
        self.x.copy_(torch.randn(1, D))

    @torch.no_grad()
    def step(self):
        src, dst = self.bufs[self.parity], self.bufs[1 - self.parity]
        y = torch.tanh(src + self.x)  # SITE
        dst.copy_(y)
        self.parity = 1 - self.parity
        return y


def make(device):
    return Target()
"""


def _fields():
    return dict(d=random.choice([4, 8, 16]), bins=random.choice([8, 16, 32]), coarse=random.choice([8, 16]))


def test_a_codebook_picked_by_a_counter_skipped_loop_is_the_branch_not_a_stale_input(tmp_path):
    path, site = write_target(tmp_path / f"multirate_{random.randrange(10**6)}.py", MULTIRATE,
                              test="self.frame % s == 0", **_fields())
    bad = blocking(path)
    assert at(bad, "stale-input-pointer", site).empty, table(bad)
    assert not at(bad, "data-dependent-control", marked_line(path, "# BRANCH")).empty, table(bad)


def test_a_codebook_picked_by_a_data_skipped_loop_is_the_branch_not_a_stale_input(tmp_path):
    path, site = write_target(tmp_path / f"multirate_data_{random.randrange(10**6)}.py", MULTIRATE,
                              test="s != 2 or bool(self.z.sum() > 0)", **_fields())
    bad = blocking(path)
    assert at(bad, "stale-input-pointer", site).empty, table(bad)
    assert not at(bad, "host-sync", marked_line(path, "# BRANCH")).empty, table(bad)


def test_buffers_alternated_by_a_python_parity_stay_a_stale_input(tmp_path):
    path, site = write_target(tmp_path / f"parity_{random.randrange(10**6)}.py", PARITY, **_fields())
    bad = blocking(path)
    assert len(at(bad, "stale-input-pointer", site)) == 1, table(bad)
