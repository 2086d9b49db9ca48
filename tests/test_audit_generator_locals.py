"""A generator the step advances (`self.writer.send(h)`, `next(self.ticker)`) changes the locals of its
suspended frame. For a library's generator the statement in its function that changes them (`pos += 1`,
not the set-up before the first `yield`) is the site and the target's call the caller; the target's own
generator is reported at the target's call (as tests/planted/host_state_hidden.py has it).
"""

from __future__ import annotations

import random
import textwrap

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

GEN = """
import torch


def writer(cache):
    pos = 0
    k = yield
    while True:
        cache[0].add_(k)
        pos += 1  # GENSITE
        k = yield cache
"""

TARGET = """
import torch
{imp}

class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.cache = torch.zeros(2, {d}, device=device)
        self.writer = writer(self.cache)
        next(self.writer)
        self.x = torch.zeros({d}, device=device)
        self.out = torch.zeros({d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn({d}))

    def step(self):
        c = self.writer.send(torch.tanh(self.x))  # SITE
        self.out.copy_(c[0])
        return self.out

def make(device):
    return Target(device)
{body}
"""


@pytest.mark.parametrize("where", ["library", "own"])
def test_a_generators_local_change_is_found_in_the_generator(tmp_path, monkeypatch, where):
    mod = f"gen_lib_{random.randrange(10**9)}"
    fields = dict(seed=random.randrange(2**31), d=random.choice([4, 8]))
    if where == "library":
        _, src = install_library(tmp_path, monkeypatch, GEN, name=mod)
        path, call = write_target(tmp_path / "target" / "gen_target.py", TARGET, imp=f"from {mod} import writer",
                                  body="", **fields)
    else:
        path, call = write_target(tmp_path / "gen_target.py", TARGET, imp="", body=textwrap.dedent(GEN), **fields)
        src = path
    bad = blocking(path, forget=mod)
    line = marked_line(src, "# GENSITE") if where == "library" else call
    hit = bad[(bad.category == "cpu-side-effect") & bad.file.str.endswith(src.name) & (bad.line == line)]
    assert len(hit) == 1, table(bad)
    assert len(bad[bad.category == "cpu-side-effect"]) == 1, table(bad)  # not the set-up `pos = 0` too
    assert hit.iloc[0].caller_file.endswith(path.name) and int(hit.iloc[0].caller_line) == call, \
        hit[["caller_file", "caller_line"]].to_string()
