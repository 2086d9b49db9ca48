"""data-dependent-control: a loop over host data that fills a host tensor runs more ops in one step, on the CPU.

A frequency penalty built on the host each step (`pen = torch.zeros(V)`, then `for t, c in self.counts.items():
pen[t] = c * alpha`, the counts kept by the scheduler in prepare()) runs one `select` + `copy_` more per new key.
Those ops run on the CPU on a GPU too: no graph records them, so the changing trip count is no path a replay
gets wrong; sending `pen` with `.to(D)` is the finding (pageable-copy). The same loop writing into the device
logits (`logits[:, t] -= c * alpha`) launches one kernel more per key: that is data-dependent-control
(audit/detectors/host/regions.py)."""

from __future__ import annotations

import random

import pytest
from site_util import LOGITS_STEP, blocking, table, write_target

TARGET = """
import torch


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {v})
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {v})
        self.counts = {{}}
        self.device = device

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        t = (i * {stride}) % {v}
        self.counts[t] = self.counts.get(t, 0) + 1

""" + LOGITS_STEP

HOST = """        pen = torch.zeros({v})
        for t, c in self.counts.items():
            pen[t] = c * {alpha}
        logits = logits - pen.to(self.device)  # SITE"""

DEVICE = """        for t, c in self.counts.items():  # SITE
            logits[:, t] -= c * {alpha}"""


@pytest.mark.parametrize("kind", ["host", "device"])
def test_a_host_only_loop_is_no_data_dependent_control(tmp_path, monkeypatch, kind):
    v = random.choice([16, 32])
    body = (HOST if kind == "host" else DEVICE).format(v=v, alpha=round(random.uniform(0.1, 1), 3))
    (tmp_path / "target").mkdir()
    path, site = write_target(tmp_path / "target" / "pen_target.py", TARGET.replace("{body}", body),
                              seed=random.randrange(2**31), d=random.choice([4, 8]), v=v, stride=random.choice([1, 3, 5]))
    bad = blocking(path)
    ddc = bad[bad.category == "data-dependent-control"]
    if kind == "device":
        assert len(ddc) >= 1 and all(f.endswith(path.name) for f in ddc.file), table(bad)
        return
    assert not len(ddc), table(bad)
    copies = bad[bad.category == "pageable-copy"]
    assert list(copies.line.astype(int)) == [site], table(bad)
