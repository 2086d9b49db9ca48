"""cpu-side-effect in the namespace a function was exec'd into.

Engines generate small helpers from source text (`exec(compile(src, "<gen>", "exec"), ns)`); the function's
globals are then the plain dict `ns`, no module's. A counter kept there (`COUNT["n"] += 1`) changes every
step and a replay never changes it. The source cannot be opened, so the finding sits at the target's call
of the function, found by the name that holds it (an attribute of the target, or a module global)."""

from __future__ import annotations

import random
import sys
import textwrap

from site_util import blocking, table, write_target

LIB = """
import torch


def make_epilogue():
    ns = {{"torch": torch, "{glob}": {{"n": 0}}}}
    src = "def epilogue(x):\\n    {glob}['n'] += 1\\n    return torch.tanh(x)\\n"
    exec(compile(src, "<gen-{tag}>", "exec"), ns)
    return ns["epilogue"]
"""

TARGET = """
import torch
from {mod} import make_epilogue

EPI = make_epilogue()


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.epi = make_epilogue()
        self.w = torch.randn({d}, {d})
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    @torch.no_grad()
    def step(self):
        h = {call}(self.x @ self.w)  # SITE
        self.out.copy_(h)
        return self.out

def make(device):
    return Target()
"""


def test_a_counter_in_an_exec_namespace_is_found_at_the_call(tmp_path, monkeypatch):
    tag = random.randrange(10**9)
    mod = f"gen_lib_{tag}"
    libdir = tmp_path / "site"
    libdir.mkdir()
    (libdir / f"{mod}.py").write_text(textwrap.dedent(LIB).format(glob=f"CALLS_{tag}", tag=tag))
    monkeypatch.syspath_prepend(str(libdir))
    (tmp_path / "target").mkdir()
    call = random.choice(["self.epi", "EPI"])
    path, site = write_target(tmp_path / "target" / "gen_target.py", TARGET, mod=mod, call=call,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    try:
        bad = blocking(path)
    finally:
        sys.modules.pop(mod, None)
    hit = bad[bad.category == "cpu-side-effect"]
    assert set(hit.line) == {site} and set(hit.file.map(lambda f: f.endswith(path.name))) == {True}, (call, table(bad))
