"""An async collective whose Work the step never waits for is an NCCL stream forked and never joined.

`dist.all_reduce(x, async_op=True)` runs on the process group's own stream (on NCCL), forked from the caller's;
`work.wait()` joins it back. A handle the step drops, or keeps for the next step, leaves the fork open: the capture
fails (unjoined work) and an eager read of the output races the collective. An unjoined-stream (blocks-capture)
at the collective's line. Waiting every handle, waiting a later handle of the same group (one stream, in order),
handing the wait to the handle's future, or a synchronous collective is clean; a wait on another group's handle
joins nothing of this one.
"""

from __future__ import annotations

import random

import pytest
import torch.distributed as dist

from site_util import at, blocking, table, write_target

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
        self.full = torch.zeros(2, {d})
        self.other = dist.new_group([0])
        self.pending = None

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}))

    def step(self):
        if self.pending is not None:
            self.pending.wait()
        torch.matmul(self.x, self.w, out=self.out)
        y = torch.tanh(self.x)
{body}
        return self.out + y


def make(device):
    return Target()
"""

ISSUE = {
    "all_reduce": "dist.all_reduce(self.out, async_op=True)",
    "gather": "dist.all_gather_into_tensor(self.full, self.out, async_op=True)",
    "broadcast": "dist.broadcast(self.out, src=0, async_op=True)",
}

UNJOINED = {
    "dropped": "        {issue}  # SITE",
    "kept": "        self.pending = {issue}  # SITE",
    "other-group": "        {issue}  # SITE\n        dist.all_reduce(y, group=self.other, async_op=True).wait()",
}

JOINED = {
    "waited": "        work = {issue}  # SITE\n        y = y * 2\n        work.wait()",
    "later-same-group": "        {issue}  # SITE\n        last = dist.all_reduce(y, async_op=True)\n        last.wait()",
    "future": "        {issue}.get_future().wait()  # SITE",
    "sync": "        dist.all_reduce(self.out)  # SITE",
    "listed": "        works = [{issue}, dist.all_reduce(y, async_op=True)]  # SITE\n        for h in works:\n            h.wait()",
}


def _write(tmp_path, body: str, call: str):
    return write_target(tmp_path / "joins_target.py", TARGET, seed=random.randrange(2**31), d=random.choice([4, 8, 16]),
                        body=body.format(issue=ISSUE[call]))


@pytest.mark.parametrize("how", sorted(UNJOINED))
def test_an_async_collective_never_waited_is_an_unjoined_stream(tmp_path, one_rank, how):
    path, site = _write(tmp_path, UNJOINED[how], random.choice(sorted(ISSUE)))
    bad = blocking(path)
    hit = at(bad, "unjoined-stream", site)
    assert len(hit) == 1 and hit.iloc[0].severity == "silent-corruption", table(bad)
    assert len(bad[bad.category == "unjoined-stream"]) == 1, table(bad)


@pytest.mark.parametrize("how", sorted(JOINED))
def test_a_waited_collective_is_no_finding(tmp_path, one_rank, how):
    path, _ = _write(tmp_path, JOINED[how], random.choice(sorted(ISSUE)))
    bad = blocking(path)
    assert not len(bad), table(bad)
