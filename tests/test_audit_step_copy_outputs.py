"""A host copy the step makes, chained on its line into an op with several outputs.

`torch.sort(lens.cpu(), descending=True)` (what `pack_padded_sequence(..., enforce_sorted=False)` runs on
lengths moved to the host) makes values and indices from the one copy: both are host memory on a GPU, and
sending the indices back (`order.to(x.device)`) is a pageable-copy (`audit/detectors/host/step_copies.py`).
The scan used to stop with a KeyError on the second output. The same sort on the device is clean.
Sizes, names and spellings are drawn fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.h = torch.randn({b}, {d}, device=device)
        self.lens = torch.zeros({b}, dtype=torch.long, device=device)
        self.out = torch.zeros(1, {d}, device=device)

    def prepare(self, i):
        self.lens.copy_(torch.randint(1, 9, ({b},)))

    @torch.no_grad()
    def step(self):
        _, {order} = {sort}  # SORT
        rows = self.h.index_select(0, {order}.to(self.h.device))  # SITE
        self.out.copy_(rows[:1] * 2.0)
        return self.out


def make(device):
    return Target(device)
"""

HOST = ["torch.sort(self.lens.cpu(), descending=True)", "self.lens.cpu().sort(descending=True)",
        "torch.sort(self.lens.to('cpu'), descending=True)"]
DEVICE = ["torch.sort(self.lens, descending=True)", "self.lens.sort(descending=True)"]


@pytest.mark.parametrize("kind", ["host", "device"])
def test_a_sort_of_a_host_copy_sent_back(tmp_path, kind):
    fields = dict(d=random.choice([4, 6, 8]), b=random.choice([3, 4, 5]),
                  order=random.choice(["order", "perm", "sorted_idx"]),
                  sort=random.choice(HOST if kind == "host" else DEVICE))
    path, site = write_target(tmp_path / "sorted_rows.py", TEMPLATE, seed=random.randrange(2**31), **fields)
    sort_line = write_target(tmp_path / "sorted_rows.py", TEMPLATE, marker="# SORT", seed=0, **fields)[1]
    path = write_target(tmp_path / "sorted_rows.py", TEMPLATE, seed=random.randrange(2**31), **fields)[0]
    bad = blocking(path)
    if kind == "device":
        assert not len(bad), table(bad)
        return
    assert list(at(bad, "host-sync", sort_line).line) == [sort_line], table(bad)
    assert list(at(bad, "pageable-copy", site).line) == [site], table(bad)
