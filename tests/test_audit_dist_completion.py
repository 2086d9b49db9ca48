"""A tensor collective's own completion work is not the step's: gloo finishes `reduce_scatter` inside
`work.wait()` by copying out of a scratch tensor no op of the step made (`aten.split`, `copy_`), which NCCL
never does. Those ops must not read as a stale input (or as any other finding); a hazard next to the
collective still does."""

from __future__ import annotations

import random

import pytest
import torch.distributed as dist

from site_util import blocking, library_hit, library_target, table

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")


LIB = """
import torch
import torch.distributed as dist

_rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

def sp_reduce(x, how):
    out = torch.empty_like(x)
    if how == "async":
        _rs(out, x.contiguous(), async_op=True).wait()
    else:
        _rs(out, x.contiguous())
    if how == "read":
        scale = float(out.abs().max())  # LIBSITE
        out = out * (1.0 if scale < 1e30 else 0.0)  # BRANCH
    return out * {k}
"""


@pytest.mark.parametrize("how", ["sync", "async", "read"])
def test_ops_inside_a_collectives_wait_are_not_the_steps(tmp_path, monkeypatch, one_rank, how):
    lib_src = LIB.replace("{k}", str(random.choice([0.5, 1.0, 2.0])))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, lib_src, "sp", "sp_reduce",
                                          f'sp_reduce(self.x @ self.w, "{how}")')
    bad = blocking(path, forget=mod)
    if how != "read":
        assert not len(bad), table(bad)
        return
    library_hit(bad, "host-sync", lib, path, site)
    library_hit(bad, "data-dependent-control", lib, path, site, marker="# BRANCH")  # the value read decides it
    assert len(bad) == 2, table(bad)
