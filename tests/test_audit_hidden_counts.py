"""Ops that read a count or a status back from the device inside torch, with no `.item()` in sight:
`torch.linalg.solve/inv/cholesky` check their `info` on the host (`_linalg_check_errors`), and a dense
tensor made sparse (`to_sparse`, `to_sparse_csr`) sizes its indices by the nonzero count. Each is a
host-sync at the calling line; the `_ex` forms, which skip the check, are clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

SYNCING = {
    "solve": "w = torch.linalg.solve(self.a + self.eye, self.b)",
    "inv": "w = torch.linalg.inv(self.a + self.eye) @ self.b",
    "cholesky": "w = torch.linalg.cholesky(self.a @ self.a.T + self.eye) @ self.b",
    "to_sparse": "w = self.b[(self.b[0] > 0).to_sparse().indices()[0]].sum(0) + self.b",
    "to_sparse_csr": "w = self.b + (self.b > 0).float().to_sparse_csr().values().sum()",
}
CLEAN = {
    "solve_ex": "w = torch.linalg.solve_ex(self.a + self.eye, self.b)[0]",
    "inv_ex": "w = torch.linalg.inv_ex(self.a + self.eye)[0] @ self.b",
}

TARGET = """
import torch

class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.a = torch.randn({d}, {d}, generator=g) * 0.1
        self.b = torch.randn({d}, {d}, generator=g)
        self.eye = torch.eye({d})
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        {line}  # SITE
        self.out.copy_(self.x @ w)
        return self.out

def make(device):
    return Target()
"""


def _write(tmp_path, line: str):
    seed, d = random.randrange(2**31), random.choice([4, 8, 12])
    return write_target(tmp_path / "hidden_count_target.py", TARGET, seed=seed, d=d, line=line)


@pytest.mark.parametrize("form", sorted(SYNCING))
def test_hidden_device_reads_are_host_syncs(tmp_path, form):
    path, site = _write(tmp_path, SYNCING[form])
    bad = blocking(path)
    hit = at(bad, "host-sync", site)
    assert len(hit) >= 1, table(bad)


@pytest.mark.parametrize("form", sorted(CLEAN))
def test_ex_forms_are_clean(tmp_path, form):
    path, _ = _write(tmp_path, CLEAN[form])
    bad = blocking(path)
    assert bad.empty, table(bad)
