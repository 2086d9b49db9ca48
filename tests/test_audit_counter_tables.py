"""data-dependent-control: a counter looked up in a fixed table of positions turns when it reaches an entry.

A T5 sentinel template forcing tokens at fixed output positions, `if self.pos in self.forced:` with `self.forced =
{0: A, 12: B, 24: C}`: the audited steps sit between entries and all skip the forcing, and a graph replays that
side forever. A membership test was never run forward (`self.n not in self.seen` may test a set the step grows);
now a dict's keys, a set, tuple, list or range of plain numbers, on the object or at module level, is read as a
table (`source/number_tables.py`) and the test runs forward like a comparison. Tables whose entries all lie behind
the counter, and a set the step grows with the counter itself, never turn and stay clean; `TABLE.get(counter) is
[not] None` (directly or through a local) is the membership test. Values are fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import torch

TABLE = {table}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.lin = torch.nn.Linear({d}, {d})
        self.x = torch.randn(1, {d})
        self.out = torch.zeros(1, {d})
        self.forced = {attr_table}
        self.seen = set()
        self.{pos} = 0

    def prepare(self, i):
        pass

    @torch.no_grad()
    def step(self):
        y = self.lin(self.x)
        if {test}:  # SITE
            y = torch.zeros_like(y)
{extra}
        self.out.copy_(y)
        self.{pos} += 1
        return self.out


def make(device):
    return Target()
"""


def _ahead():
    return sorted(random.sample(range(12, 200), 3))


CASES = {  # name: (test, table builder, extra, turns)
    "dict_keys": ("self.{pos} in self.forced", lambda t: "{" + ", ".join(f"{k}: {k + 1}" for k in t) + "}", "", True),
    "tuple": ("self.{pos} in self.forced", lambda t: repr(tuple(t)), "", True),
    "module_set": ("self.{pos} in TABLE", lambda t: repr(set(t)), "", True),
    "not_in": ("self.{pos} not in self.forced", lambda t: repr(list(t)), "", True),
    "all_behind": ("self.{pos} in self.forced", lambda t: repr({0, 1}), "", False),
    "get_not_none": ("self.forced.get(self.{pos}) is not None",
                     lambda t: "{" + ", ".join(f"{k}: {k + 1}" for k in t) + "}", "", True),
    "grown_set": ("self.{pos} in self.seen", lambda t: repr(set(t)), "        self.seen.add(self.{pos})", False),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_counter_in_a_table_of_positions(tmp_path, kind):
    test, build, extra, turns = CASES[kind]
    pos = random.choice(["pos", "cur", "n_out"])
    tbl = build(_ahead())
    tpl = TARGET.replace("{test}", test).replace("{extra}", extra)
    path, site = write_target(tmp_path / "template.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]),
                              pos=pos, table=tbl, attr_table=tbl)
    bad = blocking(path)
    assert len(at(bad, "data-dependent-control", site)) == (1 if turns else 0), table(bad)


GROWN = """
import torch


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.lin = torch.nn.Linear({d}, {d})
        self.x = torch.randn(1, {d})
        self.built = {{}}
        self.{pos} = {start}

    def prepare(self, i):
        pass

    @torch.no_grad()
    def step(self):
        self.{pos} += {stride}
        if self.{pos} not in self.built:  # SITE
            self.built[self.{pos}] = self.lin.weight.sum(0)
        return self.lin(self.x) * self.built[self.{pos}]


def make(device):
    return Target()
"""


def test_a_table_the_step_grows_with_the_counter_never_turns(tmp_path):
    """`if self.n not in self.built: self.built[self.n] = ...` after `self.n += 1`: the dict holds every value
    the counter took and none ahead (up or down), so the test never turns (the new entry is state the
    step changes, which cpu-side-effect reports)."""
    stride = random.choice([1, 2, -1, -3])
    path, site = write_target(tmp_path / "grown.py", GROWN, seed=random.randrange(2**31), d=random.choice([4, 8]),
                              pos=random.choice(["n", "pos"]), start=random.randrange(0, 50), stride=stride)
    bad = blocking(path)
    assert at(bad, "data-dependent-control", site).empty, table(bad)
    assert not at(bad, "cpu-side-effect", site + 1).empty, table(bad)


def test_a_counter_looked_up_through_a_local(tmp_path):
    """`tok = self.forced.get(self.pos)` then `if tok is not None:`: the lookup through the local turns at the
    next forced position as the membership test does."""
    pos = random.choice(["pos", "cur"])
    tbl = "{" + ", ".join(f"{k}: {k + 1}" for k in _ahead()) + "}"
    tpl = TARGET.replace("        if {test}:  # SITE", "        tok = self.forced.get(self.{pos})\n"
                                                           "        if tok is not None:  # SITE").replace("{extra}", "")
    path, site = write_target(tmp_path / "local_get.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]),
                              pos=pos, table=tbl, attr_table=tbl)
    bad = blocking(path)
    assert len(at(bad, "data-dependent-control", site)) == 1, table(bad)
