"""A host random generator the target keeps (`random.Random`, numpy's `Generator`) and draws from in
the step: its state lives in C, so no attribute of it changes, yet a replay would not advance it. The
draw is a cpu-side-effect at the drawing line; drawing in prepare() is fine.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

RNGS = {
    "random": ("import random", "random.Random({seed})", "self.rng.random()"),
    "numpy": ("import numpy as np", "np.random.default_rng({seed})", "float(self.rng.random())"),
    "numpy-legacy": ("import numpy as np", "np.random.RandomState({seed})", "self.rng.rand()"),
}

TARGET = """
{imp}
import torch

class Target:
    def __init__(self):
        self.rng = {make}
        self.w = torch.randn({d}, {d}) * 0.1
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})
        self.jitter = torch.ones(1)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        {prep}

    def step(self):
        {draw}
        self.out.copy_(torch.tanh(self.x @ self.w) * self.jitter)
        return self.out

def make(device):
    return Target()
"""


def _write(tmp_path, kind: str, in_step: bool):
    imp, make, call = RNGS[kind]
    seed, d = random.randrange(2**31), random.choice([4, 8, 16])
    draw = f"self.jitter.fill_({call})  # SITE"
    return write_target(tmp_path / "rng_target.py", TARGET, imp=imp, make=make.format(seed=seed), d=d,
                        draw=draw if in_step else "pass  # SITE", prep=draw if not in_step else "pass")


@pytest.mark.parametrize("kind", sorted(RNGS))
def test_a_draw_from_a_host_rng_in_the_step_is_a_side_effect(tmp_path, kind):
    path, site = _write(tmp_path, kind, in_step=True)
    bad = blocking(path)
    hit = at(bad, "cpu-side-effect", site)
    assert len(hit) == 1, table(bad)
    assert "rng" in hit.iloc[0].message


@pytest.mark.parametrize("kind", sorted(RNGS))
def test_a_draw_in_prepare_is_not(tmp_path, kind):
    path, _ = _write(tmp_path, kind, in_step=False)
    bad = blocking(path)
    assert not len(bad[bad.category == "cpu-side-effect"]), table(bad)
