"""cpu-side-effect in the namespace a function was exec'd into.

Engines generate small helpers from source text (`exec(compile(src, "<gen>", "exec"), ns)`); the function's
globals are then the plain dict `ns`, no module's. A counter kept there (`COUNT["n"] += 1`) changes every
step and a replay never changes it. The source cannot be opened, so the finding sits at the target's call
of the function, found by the name that holds it (an attribute of the target, or a module global)."""

from __future__ import annotations

import random
import textwrap

from site_util import blocking, install_library, module_target, table, write_target

LIB = """
import torch


def make_epilogue():
    ns = {{"torch": torch, "{glob}": {{"n": 0}}}}
    src = "def epilogue(x):\\n    {glob}['n'] += 1\\n    return torch.tanh(x)\\n"
    exec(compile(src, "<gen-{tag}>", "exec"), ns)
    return ns["epilogue"]
"""

TARGET = module_target(imports="from {mod} import make_epilogue", prelude="EPI = make_epilogue()", init="""\
        self.epi = make_epilogue()
        self.w = torch.randn({d}, {d})""", step="""\
        h = {call}(self.x @ self.w)  # SITE
        self.out.copy_(h)
        return self.out""")


def test_a_counter_in_an_exec_namespace_is_found_at_the_call(tmp_path, monkeypatch):
    tag = random.randrange(10**9)
    mod = f"gen_lib_{tag}"
    install_library(tmp_path, monkeypatch, textwrap.dedent(LIB).format(glob=f"CALLS_{tag}", tag=tag), name=mod)
    call = random.choice(["self.epi", "EPI"])
    path, site = write_target(tmp_path / "target" / "gen_target.py", TARGET, mod=mod, call=call,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    hit = bad[bad.category == "cpu-side-effect"]
    assert set(hit.line) == {site} and set(hit.file.map(lambda f: f.endswith(path.name))) == {True}, (call, table(bad))
