"""A tensor computed on the host from a host attribute alone, then sent to the device in the step, is a
copy from pageable memory (capture raises on it), also when torch's own helper does the sending:
`pack_padded_sequence(x, self.lengths, enforce_sorted=False)` sorts the host lengths and moves the order
to `x.device`. With lengths already sorted (`enforce_sorted=True`) nothing is copied.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

FORMS = {
    "pack_unsorted": "y = pack_padded_sequence(x, self.lengths, batch_first=True, enforce_sorted=False).data.sum(0)",
    "user_argsort": "y = x[:, 0] * self.lengths.argsort().to(self.device).float()[:, None].mean()",
}
CLEAN = "y = pack_padded_sequence(x, self.lengths, batch_first=True, enforce_sorted=True).data.sum(0)"

TARGET = """
import torch
from torch.nn.utils.rnn import pack_padded_sequence

class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.device = device
        self.w = torch.randn({d}, {d}, generator=g)
        self.lengths = torch.tensor({lengths}, dtype=torch.long, device="cpu")
        self.x = torch.zeros({b}, {t}, {d}, device=device)
        self.out = torch.zeros({d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {t}, {d}))

    def step(self):
        x = self.x @ self.w
        {line}  # SITE
        self.out.copy_(y.reshape(-1)[:{d}])
        return self.out

def make(device):
    return Target(device)
"""


def _write(tmp_path, line: str):
    seed, d, b, t = random.randrange(2**31), random.choice([4, 8]), random.choice([2, 3, 4]), random.choice([3, 5])
    lengths = sorted((random.randint(1, t) for _ in range(b)), reverse=True)
    lengths[0] = t
    return write_target(tmp_path / "staged_target.py", TARGET, seed=seed, d=d, b=b, t=t, lengths=lengths, line=line)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_host_derived_tensor_sent_to_the_device_is_a_pageable_copy(tmp_path, form):
    path, site = _write(tmp_path, FORMS[form])
    bad = blocking(path)
    hit = at(bad, "pageable-copy", site)
    assert len(hit) == 1, table(bad)
    assert "lengths" in hit.iloc[0].message


def test_sorted_lengths_pack_without_a_copy(tmp_path):
    path, _ = _write(tmp_path, CLEAN)
    bad = blocking(path)
    assert bad.empty, table(bad)
