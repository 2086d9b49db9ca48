"""State in the closure of a library function: found at the library's statement, caller the target's line.

A Transformer-Engine-style helper hangs a forward pre-hook on the target's module that keeps FP8
metadata in a dict of its closure (`meta["step"] += 1`); a library decorator counts calls in a
`nonlocal`. The cell belongs to the library's function, so the site is searched there (not only in
the target's files). A dict slot rebound to a tensor the step made (`meta["hist"] = torch.roll(...)`)
is step-allocation's, and a write into the tensor it holds (`meta["hist"][0] = v`) is no Python state:
neither is a cpu-side-effect line.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, module_target, table, write_target

LIB = """
import functools

import torch


def enable_meta(module, n):
    meta = {"hist": torch.zeros(n), "step": 0}

    def pre_hook(mod, args):
        meta["hist"] = torch.roll(meta["hist"], 1)  # ROLL
        meta["hist"][0] = args[0].abs().amax()  # INTO
        meta["step"] += 1  # LIBSITE

    module.register_forward_pre_hook(pre_hook)
    return meta


def counted(fn):
    calls = 0

    @functools.wraps(fn)
    def wrapper(*args):
        nonlocal calls
        calls += 1  # LIBSITE
        return fn(*args)

    return wrapper
"""

TARGET = module_target(imports="from {mod} import counted, enable_meta", prelude="""

@counted
def act(h):
    return torch.tanh(h)
""", init="""\
        self.proj = nn.Linear({d}, {d})
        {init}""", step="""\
        h = {call}  # SITE
        self.out.copy_(h)
        return self.out""")

KINDS = {
    "hook": ("self.meta = enable_meta(self.proj, {n})", "self.proj(self.x)", "pre_hook"),
    "decorator": ("pass", "act(self.proj(self.x))", "wrapper"),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_library_closures_state_is_found_at_its_statement(tmp_path, monkeypatch, kind):
    init, call, fn = KINDS[kind]
    mod, lib = install_library(tmp_path, monkeypatch, LIB, "closure_lib")
    path, site = write_target(tmp_path / "target" / "closure_target.py", TARGET, mod=mod, call=call,
                              init=init.format(n=random.choice([2, 4, 8])),
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    side = bad[bad.category == "cpu-side-effect"]
    want = [n for n, t in enumerate(lib.read_text().splitlines(), 1) if "# LIBSITE" in t]
    hit = side[side.file.str.endswith(lib.name) & side.line.isin(want)]
    assert len(hit) == 1 and hit.iloc[0].function == fn, table(bad)
    assert hit.iloc[0].caller_file.endswith(path.name) and int(hit.iloc[0].caller_line) == site, \
        hit[["caller_file", "caller_line"]].to_string()
    assert len(side) == 1, table(bad)  # no `<python state>` twin, no line of the tensor slot
    if kind == "hook":
        roll = bad[(bad.category == "step-allocation") & (bad.line == marked_line(lib, "# ROLL"))]
        assert len(roll) == 1, table(bad)
