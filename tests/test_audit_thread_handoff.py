"""Work handed to another thread is placed below the step's line that handed it over, not wherever the step's
thread happens to be when the worker runs.

vLLM-style overlap submits the host-side grammar work (`fut = pool.submit(fill, ...)`) before the forward and
waits for it later (`fut.result()`). The caller of a finding inside the worker was the step thread's current
line at that instant: the forward one step, the wait the next, a library line inside the model another time.
So the same call looked like another call from step to step. The hand-over line is fixed. Names and sizes are
drawn fresh."""

from __future__ import annotations

import random
import textwrap

from site_util import blocking, install_library, library_hit, marked_line, write_target

LIB = """
def {fn}(ids, ready):
    ready.wait(5)
    return [f"<{{t}}>" for t in ids.view(-1).tolist()]  # LIBSITE
"""

TARGET = """
import concurrent.futures
import threading

import torch
from {mod} import {fn}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {d})
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.x = torch.zeros(1, {d})
        self.tok = torch.zeros(1, dtype=torch.long)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    @torch.no_grad()
    def step(self):
        ready = threading.Event()
        self.tok.copy_((self.x @ self.w).argmax(-1))
        fut = {hand}  # SITE
        y = torch.tanh(self.x @ self.w)
        ready.set()
        text = fut.result()  # WAIT
        return y, text

def make(device):
    return Target()
"""

HANDS = ["self.pool.submit({fn}, self.tok, ready)",
         "self.pool.submit(lambda: {fn}(self.tok, ready))"]


def test_a_worker_finding_has_the_hand_over_line_as_caller(tmp_path, monkeypatch):
    tag = random.randrange(10**9)
    mod, fn = f"handoff_lib_{tag}", f"fill_{tag}"
    _, lib = install_library(tmp_path, monkeypatch, textwrap.dedent(LIB).format(fn=fn), name=mod)
    hand = random.choice(HANDS).format(fn=fn)
    path, site = write_target(tmp_path / "target" / "handoff_target.py", TARGET.replace("{hand}", hand), mod=mod,
                              fn=fn, seed=random.randrange(2**31), d=random.choice([4, 8]))
    assert marked_line(path, "# WAIT") != site
    bad = blocking(path, forget=mod)
    library_hit(bad, "host-sync", lib, path, site)
