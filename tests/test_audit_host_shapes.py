"""dynamic-shape: host data of a changing length that meets the device only in a fixed shape.

A per-request logit bias kept as a {token: bias} dict, densified on the host each step
(`torch.sparse_coo_tensor(torch.tensor([keys]), torch.tensor(vals), (V,)).to_dense()`, or a `torch.zeros(V)` row
indexed by `torch.tensor(keys)`) and sent with `.to(D)`, lifts lists of another length each step; but those are CPU
work a graph never records, and what reaches the device is a [V] row: the one finding is the pageable-copy at the
send (a Python scalar assigned through the index into that host row, `row[idx] = 1.0`, copies nothing to a
device either: audit/detectors/pageable_copy.py). Sending the lifted list itself (`torch.tensor(keys).to(D)`) puts its changing length on the device: that
stays a dynamic-shape (audit/detectors/host/host_only.py, shape_stays_on_host)."""

from __future__ import annotations

import random

import pytest
from site_util import LOGITS_STEP, blocking, table, write_target

TARGET = """
import torch

V = {v}
REQS = {reqs}


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.device = device
        self.w = torch.randn({d}, V).to(device)
        self.x = torch.zeros(1, {d}, device=device)
        self.out = torch.zeros(1, V, device=device)
        self.bias = REQS[0]

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        self.bias = REQS[i % len(REQS)]

""" + LOGITS_STEP

BODIES = {
    "sparse": """        idx = torch.tensor([list(self.bias)])  # LIFT
        dense = torch.sparse_coo_tensor(idx, torch.tensor(list(self.bias.values())), (V,)).to_dense()
        logits = logits + dense.to(self.device)  # SITE""",
    "indexed": """        row = torch.zeros(V)
        row[torch.tensor(list(self.bias))] = torch.tensor(list(self.bias.values()))  # LIFT
        logits = logits + row.to(self.device)  # SITE""",
    "scalar": """        row = torch.zeros(V)
        row[torch.tensor(list(self.bias))] = 1.0  # LIFT
        logits = logits - 1e4 * row.to(self.device)  # SITE""",
    "sent": """        keys = torch.tensor(list(self.bias)).to(self.device)  # SITE
        logits = logits.index_fill(1, keys, -1e4)""",
}


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_changing_length_that_meets_the_device_in_a_fixed_shape(tmp_path, monkeypatch, kind):
    v = random.choice([32, 48])
    lens = random.sample(range(1, 6), 3)
    reqs = [{k: round(random.uniform(-3, 3), 2) for k in random.sample(range(v), n)} for n in lens]
    (tmp_path / "target").mkdir()
    path, site = write_target(tmp_path / "target" / "bias_target.py", TARGET.replace("{body}", BODIES[kind]),
                              v=v, reqs=repr(reqs), seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    shapes = bad[bad.category == "dynamic-shape"]
    if kind == "sent":
        assert site in set(shapes.line.astype(int)), table(bad)
        return
    assert not len(shapes), table(bad)
    assert list(bad[bad.category == "pageable-copy"].line.astype(int)) == [site], table(bad)
