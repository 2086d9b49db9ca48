"""cpu-side-effect: a draw from the process-wide host generators (`random.random()`, `np.random.uniform()`).

They live in the stdlib's and numpy's globals, which the state snapshot otherwise leaves out: a router's jitter
drawn there advances them once per eager step and never in a replay. Reported at the drawing call (a library's
included, with the target's call as caller). A generator made in the step from a seed, or a draw in prepare(),
changes no process state."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

DRAWS = {
    "random": ("import random", "random.uniform(0.9, 1.1)"),
    "random-from": ("from random import gauss", "gauss(1.0, 0.01)"),
    "numpy": ("import numpy as np", "np.random.uniform(0.99, 1.01)"),
    "numpy-alias": ("from numpy import random as npr", "npr.rand()"),
}
CLEAN = ("import numpy as np", "np.random.default_rng({seed}).uniform(0.99, 1.01)")

LIB = """
import torch
{imp}


def jitter(h):
    noise = {draw}  # LIBSITE
    return h * {scale}, noise
"""


@pytest.mark.parametrize("kind", ["hit", "clean"])
def test_draw_from_a_process_wide_host_generator(tmp_path, monkeypatch, kind):
    imp, draw = DRAWS[random.choice(sorted(DRAWS))] if kind == "hit" else CLEAN
    src = (LIB.replace("{imp}", imp).replace("{draw}", draw.replace("{seed}", str(random.randrange(1000))))
           .replace("{scale}", str(random.uniform(0.5, 2.0))))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "jit", "jitter", "jitter(self.x @ self.w)",
                                          out="y[0]")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "cpu-side-effect", lib, path, site)
