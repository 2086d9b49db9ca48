"""A library that captures (or waits) only on a GPU, behind an early return a CPU scan always takes.

`if not x.is_cuda: return self.fn(x)` and then `with torch.cuda.graph(g):` (or `torch.cuda.synchronize()`):
the CPU scan runs the early return, a GPU runs what follows it. That rest is the GPU side of the guard, read
from the source: a capture begun in the step (it synchronizes first) or a wait there is a host-sync at its
line, with the target's call as caller. The same guard followed by device ops only is no finding.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, matmul_target, table, write_target

LIB = """
import torch

class Graphed:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, x):
        if not x.is_cuda:
            return self.fn(x)
        {gpu}
        return y
"""

GPU = {"capture": "g = torch.cuda.CUDAGraph()\n        with torch.cuda.graph(g):  # LIBSITE\n"
                  "            y = self.fn(x)\n        g.replay()",
       "make_graphed": "y = torch.cuda.make_graphed_callables(self.fn, (x,))(x)  # LIBSITE",
       "sync": "y = self.fn(x)\n        torch.cuda.synchronize()  # LIBSITE",
       "plain": "y = self.fn(x) * 2  # LIBSITE"}


def _target(tmp_path, monkeypatch, gpu: str):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{gpu}", GPU[gpu]), prefix="guarded")
    tpl = matmul_target(imports=f"from {mod} import Graphed", init="        self.blk = Graphed(lambda v: torch.tanh(v @ self.w))",
                        step="""        y = self.blk(self.x)  # SITE
        self.out.copy_(y)
        return self.out""")
    path, site = write_target(tmp_path / "target" / "lib_guarded.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    return mod, lib, path, site


@pytest.mark.parametrize("gpu", ["capture", "make_graphed", "sync"])
def test_a_wait_after_an_early_return_for_the_cpu_is_found_in_the_source(tmp_path, monkeypatch, gpu):
    mod, lib, path, site = _target(tmp_path, monkeypatch, gpu)
    library_hit(blocking(path, forget=mod), "host-sync", lib, path, site)


def test_device_ops_after_the_early_return_are_no_finding(tmp_path, monkeypatch):
    mod, lib, path, site = _target(tmp_path, monkeypatch, "plain")
    bad = blocking(path, forget=mod)
    assert not len(bad), table(bad)
