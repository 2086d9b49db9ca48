"""Side streams made with the device-generic API: `torch.Stream()`, `with stream:`, `torch.Event()`.

transformers' offloaded caches prefetch on `torch.Stream()` and join with `torch.cuda.default_stream(dev)`, also in
the prefill make() runs. On a CPU-only torch `torch.Stream()` is the CPU's: its block was never seen (and its
events refuse to record), and `torch.cuda.default_stream()` raised while the target was built. On a CPU scan they
are the CUDA stand-ins, as on a GPU they are CUDA streams: a block with no fork is an unjoined-stream, the legal
fork and join are no finding.
"""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

TARGET = """
import torch


class Prefetch:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.host = torch.randn({n}, {d}, {d}, generator=g, pin_memory=torch.cuda.is_available())
        self.slot = torch.empty({d}, {d}, device=device)
        self.stream = torch.Stream()
        self.x = torch.zeros(1, {d}, device=device)
        self.out = torch.zeros(1, {d}, device=device)
        torch.cuda.default_stream(self.x.device).wait_stream(self.stream)  # as a prefill would

    def prepare(self, i):
        self.x.copy_(torch.full((1, {d}), 0.1 * (i + 1)))

    @torch.no_grad()
    def step(self):
        h = self.x
        for l in range({n}):
            {fork}
            with self.stream:  # SITE
                self.slot.copy_(self.host[l], non_blocking=True)
            {join}
            h = torch.tanh(h @ self.slot)
        self.out.copy_(h)
        return self.out


def make(device):
    return Prefetch(device)
"""

JOINS = ["torch.cuda.current_stream().wait_stream(self.stream)",
         "ev = torch.Event(); ev.record(self.stream); torch.cuda.current_stream().wait_event(ev)"]


def _target(tmp_path, fork: str, join: str):
    return write_target(tmp_path / f"generic_{random.randrange(10**9)}.py", TARGET, seed=random.randrange(2**31),
                        n=random.choice([2, 3]), d=random.choice([4, 8]), fork=fork, join=join)


def test_a_generic_side_stream_with_no_fork_is_an_unjoined_stream(tmp_path):
    path, site = _target(tmp_path, "pass", random.choice(JOINS))
    bad = blocking(path)
    assert len(bad[(bad.category == "unjoined-stream") & (bad.line == site)]), table(bad)


def test_a_generic_side_stream_forked_and_joined_is_no_finding(tmp_path):
    path, _ = _target(tmp_path, "self.stream.wait_stream(torch.cuda.current_stream())", random.choice(JOINS))
    bad = blocking(path)
    assert bad.empty, table(bad)
