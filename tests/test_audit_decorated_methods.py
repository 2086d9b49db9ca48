"""State in the closure of a library decorator's wrapper on a method: found at the wrapper's statement.

`functools.wraps` gives the wrapper the method's qualified name (`Ramped.forward`), and the wrapper lives
in the class's dict, not in a module's globals nor on an object, so the closure's function was never found
and the change had no line (`<python state>`). The decorated method may be a library class's or the
target's own; the cell may be a `nonlocal` int or a list the wrapper writes (`seen[0] += 1`). A wrapper
that keeps no state stays clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, module_target, table, write_target

LIB = """
import functools

import torch
from torch import nn


def ramp(fn):
    seen = [0]
    calls = 0

    @functools.wraps(fn)
    def wrapper(self, x):
        nonlocal calls
        {line}
        return fn(self, x)

    return wrapper


class Ramped(nn.Linear):
    @ramp
    def forward(self, x):
        return super().forward(x)
"""

LINES = {
    "list_cell": "seen[0] += 1  # LIBSITE",
    "nonlocal": "calls += 1  # LIBSITE",
    "clean": "x = x * 1.0  # LIBSITE",
}

TARGET = module_target(imports="from {mod} import Ramped, ramp\nfrom torch import nn", prelude="""

class Own(nn.Linear):
    @ramp
    def forward(self, x):
        return super().forward(x)
""", init="""\
        self.lin = {cls}({d}, {d})""", step="""\
        h = self.lin(self.x)  # SITE
        self.out.copy_(h)
        return self.out""")


@pytest.mark.parametrize("owner", ["Ramped", "Own"])
@pytest.mark.parametrize("kind", sorted(LINES))
def test_a_decorated_methods_closure_state_is_found(tmp_path, monkeypatch, kind, owner):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{line}", LINES[kind]), "deco_lib")
    path, site = write_target(tmp_path / "target" / "deco_target.py", TARGET, mod=mod, cls=owner,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "cpu-side-effect", lib, path, site)
    assert not (bad.file == "<python state>").any(), table(bad)
