"""Ops a worker thread runs are not placed inside the module the step's thread is in at that moment.

torch's global module hooks fire on whichever thread calls a module, and the scan kept one module stack for
all threads: a worker's op (a grammar matcher's host work submitted before the forward) was tagged with the
module the step's thread was inside when the op ran (`block` here), so one call looked like another call from
step to step. Each thread keeps its own stack. Names and sizes are drawn fresh."""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

TARGET = """
import concurrent.futures
import threading

import torch


class Block(torch.nn.Module):
    def __init__(self, d, inside, done):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)
        self.inside, self.done = inside, done

    def forward(self, x):
        self.inside.set()
        self.done.wait(5)
        return self.lin(x)


def {fn}(ids, inside, done):
    inside.wait(5)
    try:
        return torch.nonzero(ids)  # SITE
    finally:
        done.set()


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.inside, self.done = threading.Event(), threading.Event()
        self.{blk} = Block({d}, self.inside, self.done)
        self.x = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        self.inside.clear()
        self.done.clear()

    @torch.no_grad()
    def step(self):
        fut = self.pool.submit({fn}, self.x, self.inside, self.done)
        y = self.{blk}(self.x)
        return y, fut.result()

def make(device):
    return Target()
"""


def test_a_worker_op_is_in_no_module_of_the_step_thread(tmp_path):
    blk = random.choice(["block", "layer0", "mixer"])
    path, site = write_target(tmp_path / "thread_modules.py", TARGET, fn=f"work_{random.randrange(10**6)}", blk=blk,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    hit = bad[(bad.category == "host-sync") & (bad.line == site)]
    assert len(hit) == 1, table(bad)
    assert not str(hit.iloc[0].module).startswith(blk), hit[["module", "op"]].to_string()
