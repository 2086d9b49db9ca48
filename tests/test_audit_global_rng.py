"""Python's `random` module and numpy's global `np.random` drawn from in the step (audit/detectors/global_rng.py).

Their state lives in C inside those modules, so no attribute changes; a replay would reuse the number drawn
at capture. A cpu-side-effect at the drawing line, in a library too (with the target's call as caller), in a
helper that runs no torch op, and under any import spelling. Drawing in prepare() is no finding.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, clean_or_hit, install_library, matmul_target, table, write_target

LIB = """
import random
import numpy as np
from random import random as coin
from numpy.random import rand as np_rand


def accept_py(x):
    if random.random() < 0.5:  # LIB_py
        return x * 2
    return x


def accept_coin(x):
    u = coin()  # LIB_coin
    return x * (1.0 + 0.0 * u)


def jitter_np(x):
    u = np.random.rand()  # LIB_np
    return x * (1.0 + 0.0 * u)


def jitter_from(x):
    return x * (1.0 + 0.0 * np_rand())  # LIB_from


def _noise():
    return random.gauss(0.0, 1.0)  # LIB_helper


def via_helper(x):
    n = _noise()
    return x * (1.0 + 0.0 * n)


def quiet(x):
    random.random()  # LIB_quiet
    return x


def on_device(x):
    return x * 1.0
"""

FORMS = {"py": "accept_py({x})", "coin": "accept_coin({x})", "np": "jitter_np({x})", "from": "jitter_from({x})",
         "helper": "via_helper({x})", "quiet": "quiet({x})"}  # quiet: a library function that runs no torch op


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("in_step", [True, False])
def test_a_draw_from_a_global_host_generator(tmp_path, monkeypatch, form, in_step):
    """In the step: one cpu-side-effect at the library's drawing line, the target's call as caller. The
    same call in prepare() (its result kept) is no finding."""
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="grng")
    call = FORMS[form]
    step = f"""        y = torch.tanh(self.x @ self.w)
        y = {call.format(x="y") if in_step else "on_device(y)"}  # SITE
        self.out.copy_(y)
        return self.out"""
    prep = "" if in_step else f"        self.keep = {call.format(x='torch.ones(1)')}"
    tpl = matmul_target(imports=f"from {mod} import *", step=step, prepare=prep)
    path, site = write_target(tmp_path / "target" / "grng_target.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    bad = bad[bad.category == "cpu-side-effect"]  # a branch on the coin is data-dependent-control as well
    clean_or_hit(bad, "hit" if in_step else "clean", "cpu-side-effect", lib, path, site, marker=f"# LIB_{form}")


def test_a_draw_in_the_targets_own_helper_is_its_own_site(tmp_path):
    tpl = matmul_target(imports="import random", step="""        u = self.jitter()
        self.out.copy_(torch.tanh(self.x @ self.w) * (1.0 + 0.0 * u))
        return self.out

    def jitter(self):
        return random.uniform(0.0, 1.0)  # SITE""")
    path, site = write_target(tmp_path / "own_rng.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    hit = at(bad, "cpu-side-effect", site)
    assert len(hit) == 1 and int(hit.iloc[0].caller_line) == site, table(bad)
