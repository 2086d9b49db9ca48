"""cpu-side-effect: a module hook registered in every step and never removed piles up (one more runs each
step); one registered and removed within the step, or one replacing the previous step's, does not."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, module_target, table, write_target

LIB = """
import torch
from torch.nn.modules import module as _m

_HELD = {{}}


def _stats(buf):
    def hook(mod, args, out):
        buf.add_(out.abs().amax(0) * {k})
    return hook


def attach(mod, buf):
    {register}  # LIBSITE
    return mod


def attach_temporarily(mod, buf, x):
    h = mod.register_forward_hook(_stats(buf))  # LIBSITE
    try:
        return mod(x)
    finally:
        h.remove()


def attach_replacing(mod, buf):
    if id(mod) in _HELD:
        _HELD[id(mod)].remove()
    _HELD[id(mod)] = mod.register_forward_pre_hook(lambda m, a: None)  # LIBSITE
    return mod
"""

CALLS = {"pile": "attach(self.lin, self.buf)(self.x)", "temp": "attach_temporarily(self.lin, self.buf, self.x)",
         "replace": "attach_replacing(self.lin, self.buf)(self.x)"}
REGISTER = ["mod.register_forward_hook(_stats(buf))", "mod.register_forward_pre_hook(lambda m, a: None)",
            "_m.register_module_forward_hook(_stats(buf))"]


@pytest.mark.parametrize("kind", ["pile", "temp", "replace"])
def test_hooks_registered_in_the_step(tmp_path, monkeypatch, kind):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(k=random.randrange(2, 9),
                                                                 register=random.choice(REGISTER)))
    tpl = module_target(imports=f"from {mod} import attach, attach_temporarily, attach_replacing", init="""
        self.lin = nn.Linear({d}, {d})
        self.buf = torch.zeros({d})""", step=f"""
        y = {CALLS[kind]}  # SITE
        self.out.copy_(y)
        return self.out""")
    path, site = write_target(tmp_path / "target" / "t.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]))
    try:
        bad = blocking(path, forget=mod)
    finally:
        from torch.nn.modules import module as m
        m._global_forward_hooks.clear()
    hits = bad[(bad.category == "cpu-side-effect") & bad.file.str.endswith(lib.name)
               & (bad.line == marked_line(lib, "# LIBSITE"))]
    if kind == "pile":
        assert len(hits) == 1 and int(hits.iloc[0].caller_line) == site, table(bad)
        assert hits.iloc[0].caller_file.endswith("t.py")
    else:
        assert hits.empty, table(bad)
