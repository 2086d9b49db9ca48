"""Higher-order operators in the step (`torch.cond`, `torch.while_loop`), as libraries call them eagerly.

torch hands such an operator to a dispatch mode only when the mode says it supports them, and raises
otherwise: the scan must not stop there. Eagerly, `torch.cond` with a device predicate decides with
`if pred:` on the host: a host-sync at the line that called it (in a library, with the target's call as
caller). `torch.where`, and `torch.cond` on a Python bool that stays the same, read nothing.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, library_hit, library_target, matmul_target, table, write_target

LIB = """
import torch

def gate(x, b, how):
    if how == "cond":
        return torch.cond(x.sum() > 0, lambda a: a + b, lambda a: a - b, (x,))  # LIBSITE
    if how == "flag":
        return torch.cond(True, lambda a: a + b, lambda a: a - b, (x,))
    return torch.where(x.sum() > 0, x + b, x - b)
"""


def _target(tmp_path, monkeypatch, how: str):
    return library_target(tmp_path, monkeypatch, LIB, "hops", "gate",
                          f'gate(torch.tanh(self.x @ self.w), self.w[0], "{how}")')


def test_a_library_torch_cond_on_a_device_predicate_is_a_host_sync(tmp_path, monkeypatch):
    mod, lib, path, site = _target(tmp_path, monkeypatch, "cond")
    library_hit(blocking(path, forget=mod), "host-sync", lib, path, site)


@pytest.mark.parametrize("how", ["flag", "where"])
def test_where_or_a_constant_bool_cond_is_no_finding(tmp_path, monkeypatch, how):
    mod, lib, path, site = _target(tmp_path, monkeypatch, how)
    bad = blocking(path, forget=mod)
    assert not len(bad), table(bad)


OWN = matmul_target(step="""        h = torch.tanh(self.x @ self.w)
        n = torch.zeros_like(self.x[0, 0], dtype=torch.long)  # the step's data (a host factory's would be host memory)
        i, h = torch.while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, v * 0.5), (n, h))  # SITE
        self.out.copy_(h)
        return self.out""")


def test_own_while_loop_reads_its_condition_on_the_host(tmp_path):
    path, site = write_target(tmp_path / "own_loop.py", OWN, seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    assert len(at(bad, "host-sync", site)) >= 1, table(bad)
