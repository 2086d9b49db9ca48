"""Histories of step-made tensors rotated on the host inside nested containers.

A speculative drafter keeps each request's last hidden states in a dict of lists (`reqs[rid]["hist"]`), drops the
oldest with `pop(0)` and appends the new one, then reads the window back with `torch.cat`. Replay neither rotates
the lists nor rebinds the appended slot: the rotation is a cpu-side-effect at the shifting line, found through the
nested containers, and the new tensor's escape is step-allocation's. The `cat` reading the oldest entry reads
another storage each step, but that is the same escape (what the warmup made, then what audited steps made), not
a stale input pointer beside it."""

from __future__ import annotations

import random

from site_util import blocking, marked_line, table, write_target

TEMPLATE = """
import torch


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.x = torch.zeros({b}, {d})
        self.{table} = {{f"r{{i}}": {{"{hist}": [torch.zeros({d}) for _ in range({h})]}} for i in range({b})}}

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {d}))

    def step(self):
        h = torch.relu(self.x @ self.w)  # ALLOC
        feats = []
        for row, req in enumerate(self.{table}.values()):
            req["{hist}"].pop(0)  # SITE
            req["{hist}"].append(h[row])
            feats.append(torch.cat(req["{hist}"]))
        return torch.stack(feats).sum()


def make(device):
    return Target()
"""


def test_a_nested_history_rotated_by_the_host(tmp_path):
    path, site = write_target(tmp_path / f"rotated_{random.randrange(10**6)}.py", TEMPLATE,
                              seed=random.randrange(1000), d=random.choice([8, 12, 16]), b=random.choice([1, 2, 3]),
                              h=random.choice([2, 3]), table=random.choice(["reqs", "per_req", "requests"]),
                              hist=random.choice(["hist", "recent", "window"]))
    bad = blocking(path)
    got = {(c, int(n)) for c, n in zip(bad.category, bad.line)}
    assert ("cpu-side-effect", site) in got, table(bad)
    assert ("step-allocation", marked_line(path, "# ALLOC")) in got, table(bad)
    assert "stale-input-pointer" not in set(bad.category), table(bad)
