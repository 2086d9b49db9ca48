"""A loop over the rows of a `nonzero()` result is the data's trip count, even when the audited steps kept it.

transformers' MoE experts loop `for expert_idx in expert_hit:` over `(mask.sum(...) > 0).nonzero()`. With few
tokens, the number of experts hit can be the same in every audited step while which experts differ; the op
sequences then match and only the loop's source says the count is the data's. The loop line is the finding; a
loop over a fixed range with masks is not, and a loop whose count moved is reported once, not twice.
"""

from __future__ import annotations

import random

from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch
import torch.nn.functional as F

E, T, D = 6, 4, 8


class Experts:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn(E, D, D, generator=g) * 0.1
        self.x = torch.zeros(T, D)
        self.route = torch.zeros(T, dtype=torch.long)

    def prepare(self, i):
        self.x.copy_(torch.randn(T, D))
        n = {counts}[i % 2]
        picked = torch.randperm(E)[:n]  # n distinct experts, other ones every step
        self.route.copy_(picked[torch.arange(T) % n])

    @torch.no_grad()
    def step(self):
        out = torch.zeros_like(self.x)
{body}
        return out


def make(device):
    return Experts()
"""

LOOP = """\
        hit = (F.one_hot(self.route, E).sum(0) > 0).nonzero()
        for e in hit:  # SITE
            sel = (self.route == e).float()[:, None]
            out = out + sel * (self.x @ self.w[e][0])"""

FIXED = """\
        for e in range(E):  # SITE
            sel = (self.route == e).float()[:, None]
            out = out + sel * (self.x @ self.w[e])"""

# torch.where(mask) unbinds nonzero's columns: a tuple of index tensors, no loop over rows
WHERE = """\
        for e in range(E):
            (rows,) = torch.where(self.route == e)  # SITE
            out[rows] += self.x[rows] @ self.w[e]"""


def _scan(tmp_path, body, counts):
    path, site = write_target(tmp_path / f"sized_{random.randrange(10**9)}.py", TEMPLATE, body=body,
                              counts=counts, seed=random.randrange(1000))
    return blocking(path), site


def test_a_loop_over_nonzero_rows_is_data_dependent_when_the_count_held(tmp_path):
    bad, site = _scan(tmp_path, LOOP, "(2, 2)")
    hit = at(bad, "data-dependent-control", site)
    assert len(hit) == 1, table(bad)
    assert "nonzero" in hit.iloc[0].message, table(bad)


def test_a_loop_over_a_fixed_range_is_clean(tmp_path):
    bad, site = _scan(tmp_path, FIXED, "(2, 2)")
    assert not len(bad[bad.category == "data-dependent-control"]), table(bad)


def test_a_count_that_moved_is_one_finding_at_the_loop(tmp_path):
    bad, site = _scan(tmp_path, LOOP, "(1, 3)")
    assert len(at(bad, "data-dependent-control", site)) == 1, table(bad)


def test_the_columns_torch_where_unbinds_are_no_loop(tmp_path):
    bad, site = _scan(tmp_path, WHERE, "(2, 2)")
    assert not len(at(bad, "data-dependent-control", site)), table(bad)
    assert len(at(bad, "host-sync", site)), table(bad)
