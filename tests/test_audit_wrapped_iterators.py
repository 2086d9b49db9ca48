"""An iterator the step advances is Python state also when it is a zip / enumerate / map / filter.

A sampler walks its schedule with `s, s_next = next(self.pairs)` over `zip(sigmas[:-1], sigmas[1:])`: a
replay never advances it. Builtin iterators were compared by their position (their __reduce__ carries it),
but a zip, enumerate, map or filter object by its identity alone, so the advance was not seen. Their
position is now that of the iterators they wrap (and enumerate's count).
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_hit, library_target

LIB = """
class Walker:
    def __init__(self, n):
        vals = [1.0 - k / (2 * n) for k in range(n + 1)]
        self.{attr} = {make}

    def step(self, x):
        item = next(self.{attr})  # LIBSITE
        return x * 0.5
"""

MAKES = {
    "zip": "zip(vals[:-1], vals[1:])",
    "enumerate": "enumerate(vals)",
    "map": "map(float, range(10 ** 6))",
    "filter": "filter(None, range(1, 10 ** 6))",
    "nested": "zip(enumerate(vals), map(abs, vals))",
}


@pytest.mark.parametrize("kind", sorted(MAKES))
def test_an_advanced_wrapping_iterator(tmp_path, monkeypatch, kind):
    attr = random.choice(["pairs", "_walk", "schedule_iter"])
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, LIB.replace("{make}", MAKES[kind]).replace("{attr}", attr), "walk_lib", "Walker",
        "self.wk.step(self.x @ self.w)", init="        self.wk = Walker(64)")
    library_hit(blocking(path, forget=mod), "cpu-side-effect", lib, path, site)
