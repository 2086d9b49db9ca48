"""An upload issued on a side stream inside the step (an apex-style prefetcher's `x.to(device, non_blocking=True)`
under `with torch.cuda.stream(self.stream):`) with no wait on the step's stream before it: under capture the copy
is not part of the graph and replay skips it. On a CPU scan `.to(device)` runs no op, so the block looked empty;
it is the copy kernel a GPU runs on that stream. Forked and joined, it is no finding."""

from __future__ import annotations

import random

from site_util import at, blocking, table, write_target

TARGET = """
import torch


class Target:
    def __init__(self, device):
        self.device = device
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g, device=device)
        self.host = torch.zeros({b}, {d}, pin_memory=True)
        self.stream = torch.cuda.Stream()
        self.out = torch.zeros({b}, {d}, device=device)

    def prepare(self, i):
        self.host.copy_(torch.randn({b}, {d}))

    @torch.no_grad()
    def step(self):
        cur = torch.cuda.current_stream()
        {fork}
        with torch.cuda.stream(self.stream):  # SITE
            x = self.host.to(self.device, non_blocking=True)
        {join}
        self.out.copy_(x @ self.w)
        return self.out


def make(device):
    return Target(device)
"""


def _target(tmp_path, fork: str, join: str):
    return write_target(tmp_path / f"side_upload_{random.randrange(10**9)}.py", TARGET, fork=fork, join=join,
                        seed=random.randrange(2**31), d=random.choice([4, 8]), b=random.choice([1, 2, 3]))


def test_an_upload_on_an_unforked_side_stream_is_an_unjoined_stream(tmp_path):
    path, site = _target(tmp_path, "pass", random.choice(["cur.wait_stream(self.stream)", "pass"]))
    bad = blocking(path)
    hit = at(bad, "unjoined-stream", site)
    assert len(hit) and "Tensor.to" in " ".join(hit.message), table(bad)


def test_the_upload_forked_and_joined_is_no_finding(tmp_path):
    path, _ = _target(tmp_path, "self.stream.wait_stream(cur)", random.choice(
        ["cur.wait_stream(self.stream)", "ev = self.stream.record_event(); cur.wait_event(ev)"]))
    bad = blocking(path)
    assert not len(bad[bad.category == "unjoined-stream"]), table(bad)


def test_an_upload_read_on_the_step_stream_before_the_join_is_a_missing_join(tmp_path):
    path, site = _target(tmp_path, "self.stream.wait_stream(cur)", "pass")
    bad = blocking(path)
    assert len(at(bad, "unjoined-stream", site)), table(bad)
