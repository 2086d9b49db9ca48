"""State in the closure of a function a library hangs on a module as its forward, bound or partial.

A patched forward (`mod.forward = types.MethodType(fwd, mod)`, `functools.partial(fwd, mod, orig)`) that counts
calls in a `nonlocal` or appends to a list it closes over changes Python state a replay never changes. The
function sits in the module's __dict__ behind the bound method or the partial, so its closure cells are state
like those of a plain function hung there: a cpu-side-effect at the statement, with the target's call of the
module as caller. A patched forward that only reads its closure is no finding.
"""

from __future__ import annotations

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import functools
import types

def patch(mod, how):
    orig = mod.forward
    calls, seen, scale = 0, [], 0.5

    def counted(self, x):
        nonlocal calls
        calls += 1  # LIBSITE method
        return orig(x)

    def recorded(m, inner, x):
        seen.append(x.shape[0])  # LIBSITE partial
        return inner(x)

    def scaled(self, x):
        return orig(x) * scale  # LIBSITE clean

    if how == "method":
        mod.forward = types.MethodType(counted, mod)
    elif how == "partial":
        mod.forward = functools.partial(recorded, mod, orig)
    else:
        mod.forward = types.MethodType(scaled, mod)
    return mod
"""


@pytest.mark.parametrize("how", ["method", "partial", "clean"])
def test_a_patched_forward_changing_its_closure_is_a_cpu_side_effect(tmp_path, monkeypatch, how):
    init = f'        self.lin = patch(torch.nn.Linear(self.w.shape[0], self.w.shape[0]), "{how}")'
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB, "patched", "patch", "self.lin(self.x)", init=init)
    clean_or_hit(blocking(path, forget=mod), how, "cpu-side-effect", lib, path, site, marker=f"# LIBSITE {how}")
