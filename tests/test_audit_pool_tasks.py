"""Rows fanned out to a thread pool by a library (one task per row, several workers). Two things changed with
scheduling and made findings that no data chose: the tracer's host-read depth was one counter for all threads, so
one worker inside `int(row.sum())` muted the ops (and the reads) another worker dispatched at that moment, and a
step seemed to run fewer ops (data-dependent-control); and the tasks' ops were aligned across steps by which
worker ran them first, so the k-th `out[i] = ...` of one step met another task's index in the next
(baked-host-value). The depth is per thread now, and handed-over work is aligned by the order the step handed it
over."""

from __future__ import annotations

import random
import sys

import pytest

from site_util import blocking, install_library, library_hit, table, write_target

LIB = """
from concurrent.futures import ThreadPoolExecutor

import torch

POOL = ThreadPoolExecutor({workers})


def _count(row):
    n = 0
    for j in range(row.shape[0]):
        n += int(row[j] != 0)  # LIBSITE
    return n


def counts(ids):
    futs = [POOL.submit(_count, r) for r in ids]
    return [f.result() for f in futs]


def _fill(x, out, i):
    for _ in range({reps}):
        out[i] = x[i].abs().sum()


def sums(x, out):
    futs = [POOL.submit(_fill, x, out, i) for i in range(x.shape[0])]
    for f in futs:
        f.result()
"""

TARGET = """
import torch
import {mod}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.ids = torch.randint(0, 3, ({rows}, {width}))
        self.sums = torch.zeros({rows})
        self.out = torch.zeros({rows})

    def prepare(self, i):
        self.ids.copy_(torch.randint(0, 3, ({rows}, {width})))

    def step(self):
        {call}  # SITE
        self.out.copy_(self.sums * 2)


def make(device):
    return Target()
"""


@pytest.fixture
def busy_switching():
    """Workers interleave often (the races are then near certain over a scan's steps)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _planted(tmp_path, monkeypatch, call: str):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(workers=random.choice([3, 4]),
                                                                 reps=random.choice([20, 30])), prefix="pool")
    rows = random.choice([6, 8])
    path, site = write_target(tmp_path / "target" / "pool_target.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              rows=rows, width=random.choice([24, 32]), call=call.format(mod=mod))
    return mod, lib, path, site


def test_host_reads_in_pool_tasks_mute_no_other_worker(tmp_path, monkeypatch, busy_switching):
    mod, lib, path, site = _planted(tmp_path, monkeypatch, "self.sums.copy_(torch.tensor({mod}.counts(self.ids)))")
    bad = blocking(path, forget=mod)
    library_hit(bad, "host-sync", lib, path, site)
    assert not (bad.category == "data-dependent-control").any(), table(bad)


def test_pool_tasks_align_by_hand_over_not_by_worker(tmp_path, monkeypatch, busy_switching):
    mod, lib, path, site = _planted(tmp_path, monkeypatch, "{mod}.sums(self.ids.float(), self.sums)")
    bad = blocking(path, forget=mod)
    assert bad.empty, table(bad)
