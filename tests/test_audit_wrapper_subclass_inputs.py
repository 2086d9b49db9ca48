"""torch's own wrapper subclass (DTensor, from `parallelize_module` over a one-rank device mesh) runs its
`__torch_dispatch__` below the tracer: the local tensors it makes there and the wrappers a parallel style makes in
Python (`DTensor.from_local`) are no op's output. They are the step's own data, not a stale input: a DTensor
tensor-parallel MLP is clean, and a host read on its output is still the one finding."""

from __future__ import annotations

import random

import pytest
import torch.distributed as dist

from site_util import blocking, library_hit, library_target, table

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")


LIB = """
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up = nn.Linear(d, {h} * d)
        self.down = nn.Linear({h} * d, d)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))

_MLP = {{}}

def mlp(x, how):
    if x.shape[-1] not in _MLP:
        _MLP[x.shape[-1]] = parallelize_module(MLP(x.shape[-1]), init_device_mesh("cpu", (1,)),
                                               {{"up": ColwiseParallel(), "down": RowwiseParallel()}})
    y = _MLP[x.shape[-1]](x)
    if how == "read":
        y = y * (2.0 if float(y.abs().max()) > 1e9 else 1.0)  # LIBSITE
    return y
"""


@pytest.mark.parametrize("how", ["clean", "read"])
def test_a_dtensor_tp_mlp_reads_no_stale_input(tmp_path, monkeypatch, one_rank, how):
    src = LIB.format(h=random.choice([1, 2, 4]))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "dtp", "mlp", f'mlp(self.x @ self.w, "{how}")')
    bad = blocking(path, forget=mod)
    if how == "clean":
        assert not len(bad), table(bad)
        return
    library_hit(bad, "host-sync", lib, path, site)
    assert len(bad) == 1, table(bad)
