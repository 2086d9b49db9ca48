"""A statement that a dynamic shape flows into runs other ops when torch's composite picks them by layout
(`q @ k.transpose(-1, -2)` reshapes its operand with a `view` for one pending token and a `clone` for
several): no data-dependent-control there, the varying slice is the finding. A conditional expression on a
host counter in one statement, on inputs of one shape, still is."""

from __future__ import annotations

import random

from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch

class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.buf = torch.randn(2, 4, {h}, {d}, generator=g)
        self.out = torch.zeros({h})
        self.n = 1
        self.k = 0

    def prepare(self, i):
        self.buf.copy_(torch.randn(self.buf.shape))
        self.n = 1 + (i + {shift}) % 3

    def step(self):
        x = self.buf[:, : self.n]  # SITE
        q = x.permute(0, 2, 1, 3) * 0.5
        s = q @ q.transpose(-1, -2)  # FORK
        {extra}
        self.out.copy_(s.sum((0, 2, 3)))
        return self.out

def make(device):
    return Target()
"""

EXTRA = """y = self.out.clone() if self.k % 2 else self.out.view(-1)  # HOST
        self.k += 1
        self.out.add_(y)"""


def _scan(tmp_path, host: bool):
    tpl = TEMPLATE.format(seed=random.randrange(2**31), h=random.choice([2, 4]), d=random.choice([4, 8]),
                          shift=random.randrange(3), extra=EXTRA if host else "pass")
    path, site = write_target(tmp_path / "layout_target.py", tpl)
    return blocking(path), path, site


def test_a_layout_picked_fork_is_the_dynamic_shape_not_control(tmp_path):
    bad, path, site = _scan(tmp_path, host=False)
    assert len(at(bad, "dynamic-shape", site)) == 1, table(bad)
    assert not len(bad[bad.category == "data-dependent-control"]), table(bad)


def test_a_host_counter_choice_in_one_statement_is_still_control(tmp_path):
    bad, path, site = _scan(tmp_path, host=True)
    host = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if "# HOST" in t)
    assert len(at(bad, "data-dependent-control", host)) == 1, table(bad)
    fork = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if "# FORK" in t)
    assert not len(at(bad, "data-dependent-control", fork)), table(bad)
