"""A library line reached from two of the target's lines is two findings, one per calling line.

A graph library infers a node count with `int(index.max()) + 1` in one helper (PyG's `maybe_num_nodes`) that both
`degree(dst)` and `softmax(score, dst)` reach, or drops self loops with a bool mask in one helper two conv layers
call. Each calling line is a place to fix (pass the size there, or cache): the findings were merged per library
line, keeping only the first caller, so fixing that one left a blocking read the report no longer named.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import torch


def num_nodes(index, n=None):
    return int(index.max()) + 1 if n is None else n  # LIBSITE int


def drop_loops(ei):
    return ei[:, ei[0] != ei[1]]  # LIBSITE mask


def degree(index, n=None):
    return torch.zeros(num_nodes(index, n)).scatter_add_(0, index, torch.ones(index.shape[0]))


def softmax(src, index, n=None):
    m = torch.zeros(num_nodes(index, n)).scatter_reduce_(0, index, src, "amax", include_self=False)
    e = (src - m[index]).exp()
    return e / torch.zeros(m.shape[0]).scatter_add_(0, index, e)[index]
"""

TARGET = """
import torch
from {mod} import degree, drop_loops, softmax

N, E = {n}, {e}


class Target:
    def __init__(self):
        self.gen = torch.Generator().manual_seed({seed})
        self.ei = torch.zeros(2, E, dtype=torch.long)
        self.score = torch.zeros(E)
        self.out = torch.zeros(N)

    def prepare(self, i):
        src = torch.randint(0, N, (E,), generator=self.gen)
        dst = torch.cat([torch.arange(N), torch.randint(0, N, (E - N,), generator=self.gen)])
        self.ei.copy_(torch.stack([src, dst]))
        self.score.copy_(torch.randn(E, generator=self.gen))

    def step(self):
        {first}  # FIRST
        {second}  # SECOND
        self.out.copy_(a[:N] + b[:N])
        return self.out


def make(device):
    return Target()
"""

CALLS = {
    "int": ("a = degree(self.ei[1]{size})", "b = softmax(self.score, self.ei[1]{size}).new_zeros(N)"),
    "mask": ("a = drop_loops(self.ei)[0].float()", "b = drop_loops(self.ei)[1].float()"),
}


@pytest.mark.parametrize("kind", ["int", "mask", "sized"])
def test_each_calling_line_of_a_library_read_is_a_finding(tmp_path, monkeypatch, kind):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="graphutil")
    first, second = CALLS["int" if kind == "sized" else kind]
    size = ", N" if kind == "sized" else ""
    n = random.choice([6, 8, 12])
    path, _ = write_target(tmp_path / "target" / "two_callers.py", TARGET, marker="# FIRST", mod=mod, seed=random.randrange(2**31),
                           n=n, e=n * random.choice([3, 4]), first=first.format(size=size),
                           second=second.format(size=size))
    bad = blocking(path, forget=mod)
    if kind == "sized":
        assert not len(bad), table(bad)
        return
    site = marked_line(lib, f"# LIBSITE {kind}")
    hits = bad[(bad.category == "host-sync") & bad.file.str.endswith(lib.name) & (bad.line == site)]
    callers = {marked_line(path, "# FIRST"), marked_line(path, "# SECOND")}
    assert set(hits.caller_line.astype(int)) == callers and len(hits) == 2, table(bad)


def test_the_fixed_caller_of_a_library_read_is_the_one_gone():
    from audit.report.match import match

    site = {"category": "host-sync", "file": "graphutil/num_nodes.py", "function": "num_nodes", "op": "Tensor.__int__",
            "line": random.randrange(10, 90), "caller_file": "my_gnn.py"}
    first, second = sorted(random.sample(range(5, 200), 2))
    base = [dict(site, caller_line=first), dict(site, caller_line=second)]
    for kept in random.sample([first, second], 2):
        fixed, new, remaining = match([dict(site, caller_line=kept)], base)
        assert not new and [r["caller_line"] for r in fixed] == [first + second - kept], fixed
        assert remaining[0][1]["caller_line"] == kept
