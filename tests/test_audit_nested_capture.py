"""A CUDA-graph capture begun inside the step (a library graphing its own blocks), on a CPU scan.

Inside the step's own capture that capture is nested, and `torch.cuda.graph` / `make_graphed_callables`
synchronize the device first: a host-sync at the line that begins it (a library's line, with the target's
call as caller). On a CPU-only torch `torch.cuda.CUDAGraph()` raises; the scan must not stop there. A graph
captured outside the step (in make()) and a graph pool handle taken in the step are no finding.
"""

from __future__ import annotations

import random

import pytest
import torch

from site_util import at, blocking, library_hit, library_target, matmul_target, table, write_target

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU stand-ins for CUDA graphs")

LIB = """
import torch

class SelfGraphed:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, x):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle()):  # LIBSITE
            y = self.fn(x)
        g.replay()
        return y

def graphed_now(fn, x):
    g = torch.cuda.make_graphed_callables(fn, (x,))  # MGCSITE
    return g(x)

def pooled(fn, x):
    torch.cuda.graph_pool_handle()
    return fn(x)
"""


def _lib_target(tmp_path, monkeypatch, call: str):
    return library_target(tmp_path, monkeypatch, LIB, "graphs", "SelfGraphed, graphed_now, pooled", call,
                          out="y * 2", init="        self.blk = SelfGraphed(lambda v: torch.tanh(v @ self.w))")


def test_a_library_capturing_in_the_step_is_a_host_sync_at_its_line(tmp_path, monkeypatch):
    mod, lib, path, site = _lib_target(tmp_path, monkeypatch, "self.blk(self.x)")
    library_hit(blocking(path, forget=mod), "host-sync", lib, path, site)


def test_make_graphed_callables_in_the_step_is_a_host_sync(tmp_path, monkeypatch):
    mod, lib, path, site = _lib_target(tmp_path, monkeypatch, "graphed_now(lambda v: torch.tanh(v @ self.w), self.x)")
    library_hit(blocking(path, forget=mod), "host-sync", lib, path, site, marker="# MGCSITE")


def test_a_pool_handle_alone_in_the_step_is_no_finding(tmp_path, monkeypatch):
    mod, lib, path, site = _lib_target(tmp_path, monkeypatch, "pooled(lambda v: torch.tanh(v @ self.w), self.x)")
    bad = blocking(path, forget=mod)
    assert not len(bad), table(bad)


OWN = matmul_target(step="""        g = torch.cuda.CUDAGraph()
        {enter}
            y = torch.tanh(self.x @ self.w)
        g.replay()
        self.out.copy_(y)
        return self.out""")


def test_own_capture_in_the_step_is_one_host_sync_and_the_body_still_runs(tmp_path):
    path, site = write_target(tmp_path / "own_capture.py", OWN, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), enter="with torch.cuda.graph(g):  # SITE")
    bad = blocking(path)
    assert len(at(bad, "host-sync", site)) == 1 and len(bad) == 1, table(bad)


def test_capture_begin_in_the_step_is_a_host_sync(tmp_path):
    path, site = write_target(tmp_path / "own_begin.py", OWN, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), enter="g.capture_begin()  # SITE\n        if True:")
    bad = blocking(path)
    assert len(at(bad, "host-sync", site)) == 1, table(bad)
