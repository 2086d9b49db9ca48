"""A library object's dunder that the target's syntax runs: the target's line is the caller.

A wrapper's `__getattr__` counting look-ups runs on `self.box.scale`, its `__getitem__` on
`self.box[k]`, its `__len__` on `len(self.box)`. No call in the target names the method and the method
runs no torch op, so the caller is the target's line with that syntax on the object, not the library
line again.
"""

from __future__ import annotations

import random
import textwrap

import pytest

from site_util import blocking, install_library, library_hit, marked_line, matmul_target, table, write_target

LIB = """
class Box:
    def __init__(self, scale):
        object.__setattr__(self, "_scale", scale)
        object.__setattr__(self, "_hits", {{}})

    def {dunder}(self, {arg}):
        self._hits["n"] = self._hits.get("n", 0) + 1  # LIBSITE
        return {ret}
"""

USES = {
    "__getattr__": ("name", "self._scale", "self.box.scale"),
    "__getitem__": ("key", "self._scale", "self.box['scale']"),
    "__len__": ("", "2", "len(self.box)"),
}

TARGET = matmul_target(imports="from {mod} import Box", init="        self.box = Box(0.5)", step="""\
        h = torch.tanh(self.x @ self.w)
        s = {use}  # SITE
        self.out.copy_(h * s)
        return self.out""")


@pytest.mark.parametrize("dunder", sorted(USES))
def test_a_library_dunder_run_by_syntax_has_the_targets_line_as_caller(tmp_path, monkeypatch, dunder):
    arg, ret, use = USES[dunder]
    mod, lib = install_library(tmp_path, monkeypatch, textwrap.dedent(LIB).format(dunder=dunder, arg=arg, ret=ret)
                               .replace("(self, )", "(self)"), "box_lib")
    path, site = write_target(tmp_path / "target" / "box_target.py", TARGET, mod=mod, use=use,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    library_hit(bad, "cpu-side-effect", lib, path, site)


CTX_LIB = """
_STATE = {"on": False, "n": 0}


class Autocast:
    def __enter__(self):
        self.prev = _STATE["on"]
        _STATE["on"] = True

    def __exit__(self, *exc):
        _STATE["on"] = self.prev
        _STATE["n"] += 1  # LIBSITE
"""

CTX_TARGET = matmul_target(imports="{imp}", step="""\
        with {cls}():  # SITE
            h = torch.tanh(self.x @ self.w)
        self.out.copy_(h)
        return self.out""")


@pytest.mark.parametrize("qualified", [False, True])
def test_an_inline_library_context_managers_exit_has_the_with_line_as_caller(tmp_path, monkeypatch, qualified):
    """`with Autocast():` makes the object inline: no attribute holds it. Its `__exit__` advancing a module
    global is found at that statement, with the `with` line as caller; the statements writing the slot it
    restores (`_STATE["on"]`) are no sites, since that slot did not change."""
    mod, lib = install_library(tmp_path, monkeypatch, CTX_LIB, "ctx_lib")
    imp, cls = (f"import {mod}", f"{mod}.Autocast") if qualified else (f"from {mod} import Autocast", "Autocast")
    path, site = write_target(tmp_path / "target" / "ctx_target.py", CTX_TARGET, imp=imp, cls=cls,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    side = bad[bad.category == "cpu-side-effect"]
    assert len(side) == 1 and side.iloc[0].file.endswith(lib.name) and \
        int(side.iloc[0].line) == marked_line(lib, "# LIBSITE"), table(bad)
    assert side.iloc[0].caller_file.endswith(path.name) and int(side.iloc[0].caller_line) == site, \
        side[["caller_file", "caller_line"]].to_string()
