"""cpu-side-effect: a small numpy array holding NaN is no change when the step leaves it alone.

Host objects often keep NaN sentinels in small arrays (scipy's interp1d keeps `fill_value=nan` as
`_fill_value_below/above`, a tracker starts from `np.full(n, np.nan)`). Small arrays are compared by value,
and NaN equals nothing, not even itself: the array must not read as changed because of it. A step that
writes one of its elements in place is still a change."""

from __future__ import annotations

import random

import pytest

from site_util import SEEDED_TARGET, blocking, table, write_target

TEMPLATE = """
import numpy as np
import torch


""" + SEEDED_TARGET + """        self.fill = np.{made}

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        self.out.copy_(self.x @ self.w)
{write}


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_a_nan_array_left_alone_is_no_side_effect(tmp_path, kind):
    n = random.randint(1, 7)  # NaNs, then one number: n + 1 <= 8 elements, compared by value
    nan, zero = random.choice([("np.nan", "0.0"), ("complex(np.nan, 1.0)", "0j")])
    made = f"append(np.full({n}, {nan}), {zero})"
    write = "        self.fill[-1] += 1  # SITE" if kind == "hit" else "        pass"
    path, _ = write_target(tmp_path / "nan_fill.py", TEMPLATE, marker="self.fill = ", seed=random.randrange(2**31),
                           d=random.choice([4, 8]), made=made, write=write)
    bad = blocking(path)
    if kind == "clean":
        assert not len(bad), table(bad)
    else:
        assert list(bad.category) == ["cpu-side-effect"], table(bad)
