"""step-allocation for a tensor made in a callee and kept by the step: the finding is at the step's assignment.

A recurrent policy returns a fresh hidden state and value from its forward; a rollout step that keeps them with
`self.h = h.detach()` and `self.prev_value = value` reads them back next step (silent under replay). The fix is at
those assignments (a static buffer refilled with copy_), not inside the model's forward, so that is where the
finding goes, once per assignment. So is a helper's assignment that the step calls by name (`self.keep(value)`, which runs no op). A
tensor allocated in the assigning function itself keeps the allocation's line,
and a step that copy_s into static buffers is clean.
"""

from __future__ import annotations

import random

import audit
from site_util import at, marked_line, table, write_target

TARGET = """
import torch
from torch import nn


class Policy(nn.Module):
    def __init__(self, v, d):
        super().__init__()
        self.embed = nn.Embedding(v, d)
        self.cell = nn.GRUCell(d, d)
        self.v_head = nn.Linear(d, 1)

    def forward(self, ids, h):
        h2 = self.cell(self.embed(ids), h)  # MADE
        return self.v_head(h2).squeeze(-1), h2


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.policy = Policy({v}, {d}).to(device)
        self.ids = torch.randint(0, {v}, ({b},), device=device)
        self.h = torch.zeros({b}, {d}, device=device)
        self.prev_value = torch.zeros({b}, device=device)
        self.deltas = torch.zeros({b}, device=device)

    def prepare(self, i):
        self.ids.copy_(torch.randint(0, {v}, ({b},)))

    def keep(self, v):
        self.prev_value = v  # HELPER

    @torch.no_grad()
    def step(self):
        value, h = self.policy(self.ids, self.h)
        {keep_h}  # SITE
        self.deltas.copy_(0.99 * value - self.prev_value)
        {keep_v}  # SITE2
        return value


def make(device="cpu"):
    return Target(device)
"""


def _scan(tmp_path, keep_h: str, keep_v: str):
    fields = dict(seed=random.randrange(2**31), v=random.choice([16, 32]), d=random.choice([8, 16]),
                  b=random.choice([2, 4]), keep_h=keep_h, keep_v=keep_v)
    path, site = write_target(tmp_path / "stored_target.py", TARGET, **fields)
    bad = audit.scan(f"{path}:make", device="cpu", steps=4).blocking()
    return bad, site, marked_line(path, "# SITE2"), marked_line(path, "# MADE"), marked_line(path, "# HELPER")


def test_a_callees_tensor_kept_by_rebinding_is_reported_at_the_assignment(tmp_path):
    bad, site, site2, made, _ = _scan(tmp_path, "self.h = h.detach()", "self.prev_value = value")
    for line in (site, site2):
        hit = at(bad, "step-allocation", line)
        assert len(hit) == 1 and hit.iloc[0].severity == "silent-corruption", table(bad)
    assert f":{made} " in at(bad, "step-allocation", site).iloc[0].message, table(bad)
    assert not len(bad[bad.category == "step-allocation"]) - 2, table(bad)


def test_a_helper_that_only_assigns_is_the_site(tmp_path):
    """`self.keep(value)` runs no torch op, so it is on no stack; the step calls it by name."""
    bad, site, site2, _, helper = _scan(tmp_path, "self.h, self.c = h.detach(), None", "self.keep(value)")
    assert len(at(bad, "step-allocation", helper)) == 1, table(bad)
    assert len(at(bad, "step-allocation", site)) == 1, table(bad)
    assert len(bad[bad.category == "step-allocation"]) == 2, table(bad)


def test_an_allocation_in_the_assigning_function_keeps_its_line(tmp_path):
    bad, site, _, _, _ = _scan(tmp_path, "t = torch.tanh(h); self.h = t", "self.prev_value.copy_(value)")
    assert len(at(bad, "step-allocation", site)) == 1, table(bad)
    assert len(bad) == 1, table(bad)


def test_an_allocation_made_while_the_assignment_ran_keeps_its_line(tmp_path):
    """`self.prev_value, self.h = self.policy(...)`: the forward ran inside the assigning statement, so its finding
    is where it was, in the forward, as the convention for a state tuple stored back from a cell has it."""
    bad, site, _, made, _ = _scan(tmp_path, "self.prev_value, self.h = self.policy(self.ids, self.h)", "pass")
    assert len(at(bad, "step-allocation", made)) == 1, table(bad)
    assert not len(at(bad, "step-allocation", site)), table(bad)


def test_static_buffers_refilled_in_place_are_clean(tmp_path):
    bad, _, _, _, _ = _scan(tmp_path, "self.h.copy_(h)", "self.prev_value.copy_(value)")
    assert len(bad) == 0, table(bad)


LIB = """
import torch


def grow(t, x):
    return torch.cat([t, x])  # LIBSITE
"""

SPLIT = """
import torch
from {mod} import grow


class Target:
    def __init__(self):
        self.x = torch.zeros(1, {d})
        self.k = torch.zeros({n}, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        self.k = (  # FIRST
            grow(self.k, self.x * 2))  # CALL
        return self.k.sum(0)


def make(device):
    return Target()
"""


def test_a_library_allocation_assigned_by_its_calling_statement_stays_in_the_library(tmp_path, monkeypatch):
    """The assignment spans two lines; the library call is on its second: the finding keeps the library's line
    with the call as caller, not the statement's first line."""
    from site_util import install_library, library_hit, blocking

    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="splitgrow")
    path, first = write_target(tmp_path / "target" / "split_grow.py", SPLIT, marker="# FIRST", mod=mod,
                               d=random.choice([4, 8]), n=random.randrange(1, 4))
    bad = blocking(path, forget=mod)
    library_hit(bad, "step-allocation", lib, path, marked_line(path, "# CALL"))
    assert not len(at(bad, "step-allocation", first)), table(bad)
