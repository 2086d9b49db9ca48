"""CUDA-only branches of an installed library's functions, read on a CPU scan.

A kernel library sizes its GPU path from a host read (`if q.is_cuda: n = int(lens.max())`) or waits when
a GPU is present (`if torch.cuda.is_available(): torch.cuda.synchronize()`). A CPU scan never takes
that side, yet a GPU does, inside the captured region. The library's side is read only when the test
itself says a GPU takes it; an MPS workaround (`if x.device.type == "mps":`) is not the GPU's side.
A library function the step calls directly is read even when it ran no torch op.
"""

from __future__ import annotations

import random
import textwrap

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import torch


def attend(q, lens):
    if {test}:
        n = int(lens.max())  # LIBSITE
        return q[:, :n].sum(-1, keepdim=True)
    return q.sum(-1, keepdim=True)


def flush():
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # FLUSH
"""

TARGET = """
import torch
from {mod} import attend, flush

class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.lens = torch.full((1,), {d}, dtype=torch.long)
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        h = attend(torch.tanh(self.x @ self.w), self.lens)  # SITE
        flush()  # FLUSHCALL
        self.out.copy_(h.expand(1, {d}))
        return self.out

def make(device):
    return Target()
"""

CUDA_TESTS = ["q.is_cuda", 'q.device.type == "cuda"', 'q.device.type != "cpu"', "torch.cuda.is_available()",
              'not q.device.type == "cpu"', "not q.is_cpu"]
OTHER_TESTS = ['q.device.type == "mps"', "q.requires_grad"]


def _scan(tmp_path, monkeypatch, test):
    mod, lib = install_library(tmp_path, monkeypatch, textwrap.dedent(LIB).format(test=test), "guard_lib")
    path, site = write_target(tmp_path / "target" / "guard_target.py", TARGET, mod=mod,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    return bad[bad.category == "host-sync"], lib, path, site


def _at(sync, lib, marker):
    return sync[sync.file.str.endswith(lib.name) & (sync.line == marked_line(lib, marker))]


@pytest.mark.parametrize("test", CUDA_TESTS)
def test_a_librarys_cuda_only_read_is_found_with_the_targets_call(tmp_path, monkeypatch, test):
    sync, lib, path, site = _scan(tmp_path, monkeypatch, test)
    hit = _at(sync, lib, "# LIBSITE")
    assert len(hit) == 1, table(sync)
    assert hit.iloc[0].caller_file.endswith(path.name) and int(hit.iloc[0].caller_line) == site, table(hit)
    flush = _at(sync, lib, "# FLUSH")  # ran no torch op: found from the target's direct call
    assert len(flush) == 1 and int(flush.iloc[0].caller_line) == marked_line(path, "# FLUSHCALL"), table(sync)


@pytest.mark.parametrize("test", OTHER_TESTS)
def test_a_librarys_branch_not_settled_by_cuda_is_left_alone(tmp_path, monkeypatch, test):
    sync, lib, _, _ = _scan(tmp_path, monkeypatch, test)
    assert not len(_at(sync, lib, "# LIBSITE")), table(sync)
