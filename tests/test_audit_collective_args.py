"""A collective's process group and reduce op are arguments a graph bakes.

`dist.all_reduce(x, op=..., group=...)` reaches the dispatcher as `c10d.allreduce_` with the group and the op as
TorchScript objects, which the trace kept only by type name: a step that switches the reduce op between steps
(`op=self.ops[self.mode]`) or picks another group from a dict (`group=self.groups[self.mode]`) read as the same
call. Replay runs the captured op on the captured communicator: a baked-host-value at the collective's line.
The same group and op every step (a dict read with a fixed key, a fresh `ReduceOp` object per call) is clean.
"""

from __future__ import annotations

import random

import pytest
import torch.distributed as dist

from site_util import blocking, table, write_target

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")

TARGET = """
import torch
import torch.distributed as dist


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.x = torch.zeros(2, {d})
        self.out = torch.zeros(2, {d})
        self.groups = {{"a": dist.new_group([0]), "b": dist.new_group([0])}}
        self.ops = {{"a": dist.ReduceOp.SUM, "b": dist.ReduceOp.{other}}}
        self.mode = "a"

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}))
        self.mode = {mode}

    def step(self):
        torch.matmul(self.x, self.w, out=self.out)
        dist.{call}  # SITE
        return self.out


def make(device):
    return Target()
"""

CALLS = {
    "op": "all_reduce(self.out, op=self.ops[self.mode])",
    "group": "all_reduce(self.out, group=self.groups[self.mode])",
    "group-broadcast": "broadcast(self.out, src=0, group=self.groups[self.mode])",
}


@pytest.mark.parametrize("what", sorted(CALLS))
@pytest.mark.parametrize("changes", [True, False])
def test_a_collectives_group_and_op_are_baked(tmp_path, one_rank, what, changes):
    path, site = write_target(tmp_path / "coll_target.py", TARGET, seed=random.randrange(2**31),
                              d=random.choice([8, 16]), other=random.choice(["MAX", "MIN", "PRODUCT"]),
                              mode='"b" if i % 2 else "a"' if changes else random.choice(['"a"', '"b"']),
                              call=CALLS[what])
    bad = blocking(path)
    here = bad[(bad.line == site) & (bad.category == "baked-host-value")]
    if changes:
        assert len(here) == 1 and len(bad) == 1, table(bad)
        assert ("ReduceOp." if what == "op" else "ProcessGroup") in here.iloc[0].message, table(bad)
    else:
        assert not len(bad), table(bad)
