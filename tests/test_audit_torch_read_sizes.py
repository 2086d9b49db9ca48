"""A size torch derives from its own read of a device value is the host-sync's, not a baked host value
(audit/detectors/tensors/read_values.py).

`F.one_hot(ids)` without `num_classes` (a MoE router counting expert hits) reads `ids.max()` back and allocates
`zeros([*ids.shape, max + 1])`: the host-sync and the dynamic-shape at that line. The size's changing element is
the read value plus one, no host value of the code's: no baked-host-value beside them. The code's own read
(`F.one_hot(ids, int(ids.max()) + 1)`) is a Python value of its own and stays baked. The same over 2-d ids (a
frequency penalty's token counts), against `torch.zeros(b, int(ids.max()) + 1)` written by the code.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch
import torch.nn.functional as F


class Step:
    def __init__(self, device):
        self.ids = torch.zeros({t}, dtype=torch.long, device=device)
        self.w = torch.randn({e}, generator=torch.Generator().manual_seed({seed})).to(device)
        self.out = torch.zeros({e}, device=device)

    def prepare(self, i):
        top = ({e} - 1) if i % 2 else ({e} - 2)
        ids = torch.randint(0, top + 1, ({t},))
        ids[{t} // 2] = top
        self.ids.copy_(ids)

    @torch.no_grad()
    def step(self):
        hits = {one_hot}.sum(0)  # SITE
        self.out.zero_()
        self.out[: hits.shape[0]] += hits * self.w[: hits.shape[0]]
        return self.out


def make(device):
    return Step(device)
"""

CASES = {
    "torch reads the max": ("F.one_hot(self.ids)", {"host-sync", "dynamic-shape"}),
    "the code reads the max": ("F.one_hot(self.ids, int(self.ids.max()) + 1)",
                               {"host-sync", "dynamic-shape", "baked-host-value"}),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_one_hot_classes_from_torchs_read(tmp_path, kind):
    call, want = CASES[kind]
    path, site = write_target(tmp_path / f"oh_{random.randrange(10**6)}.py", TEMPLATE, t=random.randint(6, 20),
                              e=random.randint(4, 12), seed=random.randrange(10**6), one_hot=call)
    bad = blocking(path)
    here = bad[bad.line == site]
    assert set(here.category) == want, table(bad)
    assert len(at(bad, "host-sync", site)) >= 1, table(bad)


# a frequency penalty's token counts over a (batch, length) id table
PENALTY_TARGET = """
import torch
import torch.nn.functional as F


class Runner:
    def __init__(self, device):
        self.ids = torch.zeros({b}, {l}, dtype=torch.long, device=device)
        self.out = torch.zeros({b}, {v}, device=device)

    def prepare(self, i):
        self.ids.copy_(torch.randint(0, {lo} + 3 * i, ({b}, {l})))

    @torch.no_grad()
    def step(self):
        counts = {counts}  # SITE
        self.out.zero_()
        self.out[:, : counts.shape[-1]].copy_(counts.float())
        return self.out


def make(device):
    return Runner(device)
"""


def _penalty_target(tmp_path, own_read: bool):
    b, l, lo = random.choice([2, 3]), random.choice([16, 24]), random.choice([20, 30])
    if own_read:
        counts = "torch.zeros({b}, int(self.ids.max()) + 1, device=self.ids.device).scatter_add_(1, self.ids, " \
                 "torch.ones_like(self.ids, dtype=torch.float))".format(b=b)
    else:
        counts = random.choice(["F.one_hot(self.ids).sum(1)", "torch.nn.functional.one_hot(self.ids).sum(dim=1)"])
    return write_target(tmp_path / "read_sizes.py", PENALTY_TARGET, b=b, l=l, v=lo + 40, lo=lo, counts=counts)


def test_one_hot_size_is_the_reads(tmp_path):
    path, site = _penalty_target(tmp_path, own_read=False)
    bad = blocking(path)
    assert len(at(bad, "host-sync", site)) == 1, table(bad)
    assert len(at(bad, "dynamic-shape", site)) == 1, table(bad)
    assert not len(at(bad, "baked-host-value", site)), table(bad)


def test_own_read_stays_baked(tmp_path):
    path, site = _penalty_target(tmp_path, own_read=True)
    bad = blocking(path)
    assert len(at(bad, "baked-host-value", site)) == 1, table(bad)
