"""A layout pick that aligns as ops one step ran and the other did not, or that runs into the next statement.

`nn.Linear` on a `[B, n, D]` slice of a padded encoder buffer flattens the slice with a `view` when `n` fills the
buffer (contiguous: `view` + `addmm` + `view`) and copies it otherwise (`clone` + `mm` + `add`). Between the two
paths sits the weight's `t`, which both run, so the lone `view` is an op one step ran and the other did not; with
`k = self.k_proj(enc)` and `v = self.v_proj(enc)` on lines of their own, the first projection's differing tail and
the second's flattening `view` form one region. No branch chose any of it: the varying bound is the hazard,
reported at the slice, even when the short bound is the same every time (the full one dispatches an `alias`, no
`slice`, so no one call changes shape: the subscript's result is compared instead). A one-statement fork that adds a kernel is still data-dependent-control.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, marked_line, table, write_target

TARGET = """
import torch


class Target:
    def __init__(self):
        self.proj = torch.nn.Linear({d}, 2 * {d})
        self.kp = torch.nn.Linear({d}, {d})
        self.vp = torch.nn.Linear({d}, {d})
        self.buf = torch.randn({b}, {s}, {d})
        self.q = torch.randn({b}, {d})
        self.n = {s}
        self.flag = False

    def prepare(self, i):
        self.buf.copy_(torch.randn({b}, {s}, {d}))
        self.n = {n_expr}
        self.flag = i % 2 == 0

    @torch.no_grad()
    def step(self):
        enc = self.buf[:, : self.n]  # SLICE
        {use}
        return torch.einsum("bd,bnd->bn", self.q, k + v)


def make(device):
    return Target()
"""

FORMS = {
    "chunked": "q = self.q * 0.5\n        k, v = self.proj(enc).chunk(2, dim=-1)  # USE",
    "own_lines": "k = self.kp(enc)  # USE\n        v = self.vp(enc)",
    "right_after_slice": "kv = self.proj(enc)  # USE\n        k, v = kv.chunk(2, dim=-1)",
}
FORKED = "k, v = (self.proj(enc) if self.flag else self.proj(enc * 2.0)).chunk(2, dim=-1)  # USE"
FILLS_SOMETIMES = "{s} if i % 2 else int(torch.randint(3, {s} - 1, ()))"
FILLS_OR_FIVE = "{s} if i % 2 else 5"  # no slice call changes shape: the full bound dispatches an alias instead


def _scan(tmp_path, n_expr, use):
    d, b, s = random.choice([16, 32]), random.choice([2, 3]), random.choice([12, 20])
    path, _ = write_target(tmp_path / "layout_views.py", TARGET, "# SLICE", d=d, b=b, s=s,
                           n_expr=n_expr.format(s=s), use=use)
    return path, blocking(path)


@pytest.mark.parametrize("bound", [FILLS_SOMETIMES, FILLS_OR_FIVE])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_full_and_partial_slices_fork_no_control(tmp_path, form, bound):
    # the bound fills the buffer every other step: view + addmm against clone + mm + add
    path, bad = _scan(tmp_path, bound, FORMS[form])
    assert len(at(bad, "dynamic-shape", marked_line(path, "# SLICE"))), table(bad)
    assert not len(bad[bad.category == "data-dependent-control"]), table(bad)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_fixed_bound_clean(tmp_path, form):
    _, bad = _scan(tmp_path, "{s} - 2", FORMS[form])
    assert not len(bad), table(bad)


def test_one_statement_fork_with_a_kernel_still_reported(tmp_path):
    path, bad = _scan(tmp_path, "{s} - 2", FORKED)
    assert len(at(bad, "data-dependent-control", marked_line(path, "# USE"))), table(bad)
