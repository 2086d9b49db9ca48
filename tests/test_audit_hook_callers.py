"""A hook torch runs from a module's call, which runs no torch op, has the target's call of the module as caller.

A library's profiler hook counting calls in its module globals, an activation recorder (a bound method)
appending each output's shape to a list, a process-wide hook (`register_module_forward_hook`) counting
only `nn.Linear` calls: none of them leaves an op record with its frame, so the finding's caller was the
target's line that installed the hook, or the library's own line. The tracer notes which hooks each
module call runs and who called the module; a process-wide hook guarded by `isinstance(mod, C)` counts
at a call of a C module only (the LayerNorm the target calls first is not the caller). A hook that keeps
no state stays clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, module_target, write_target

LIB = """
from torch import nn

CALLS = {}


def count_calls(module, name):
    def post(mod, args, out):
        CALLS[name] = CALLS.get(name, 0) + 1  # LIBSITE count
        return out

    return module.register_forward_hook(post)


class Recorder:
    def __init__(self):
        self.shapes = []

    def hook(self, mod, args, out):
        self.shapes.append(tuple(out.shape))  # LIBSITE recorder
        return out


def record(module):
    r = Recorder()
    module.register_forward_hook(r.hook)
    return r


HITS = {"n": 0}


def global_counter():
    def post(mod, args, out):
        if isinstance(mod, nn.Linear):
            HITS["n"] += 1  # LIBSITE global
        return out

    return nn.modules.module.register_module_forward_hook(post)


def quiet(module):
    def post(mod, args, out):
        return out  # LIBSITE clean

    return module.register_forward_hook(post)
"""

INSTALL = {
    "count": 'count_calls(self.lin, "lin")',
    "recorder": "self.rec = record(self.lin)",
    "global": "self.handle = global_counter()",
    "clean": "quiet(self.lin)",
}

TARGET = module_target(imports="from {mod} import count_calls, global_counter, quiet, record", init="""\
        self.norm = nn.LayerNorm({d})
        self.lin = nn.Linear({d}, {d})
        {install}""", step="""\
        h = self.norm(self.x)
        h = self.lin(h)  # SITE
        self.out.copy_(h)
        return self.out""")


@pytest.mark.parametrize("kind", sorted(INSTALL))
def test_a_hook_that_runs_no_op_has_the_modules_call_as_caller(tmp_path, monkeypatch, kind):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, "hook_lib")
    path, site = write_target(tmp_path / "target" / "hook_target.py", TARGET, mod=mod, install=INSTALL[kind],
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    from torch.nn.modules import module as m
    before = set(m._global_forward_hooks)
    try:
        bad = blocking(path, forget=mod)
    finally:
        for k in set(m._global_forward_hooks) - before:  # the process-wide hook outlives the target
            del m._global_forward_hooks[k]
    clean_or_hit(bad, kind, "cpu-side-effect", lib, path, site, marker=f"# LIBSITE {kind}")
