"""CPU work on a host grid whose size changes per request, read back on the host alone.

A processor-side check builds a grid sized by the request's image (`torch.ones(h, w)` naming no device) and
reads its sum back (`int(...)`, an assert or a budget capped to a constant). On a GPU that grid is host memory:
no kernel, nothing a graph holds, so its changing shape and size arguments are neither dynamic-shape nor
baked-host-value, and the read waits for nothing. The same grid made on the device is a host-sync at the read.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch


def budget(x, h, w, cap):
    grid = torch.{factory}(h, w{dev}){chain}
    n = int(grid.sum())  # LIBSITE
    {use}
    return x * min(n, cap)
"""

USES = ["assert n >= 0", "pass", "n = min(n, h * w)"]  # (a cumsum grid sums past h * w)


@pytest.mark.parametrize("kind", ["host", "device"])
def test_host_grid_of_changing_size(tmp_path, monkeypatch, kind):
    src = LIB.format(factory=random.choice(["ones", "zeros"]),  # (`empty` may hold NaN: int() of its sum raises)
                     dev=", device=x.device" if kind == "device" else "", chain=random.choice(["", ".float()", ".cumsum(0)", "[:, :1]"]),
                     use=random.choice(USES))
    w = random.randint(1, 3)
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "hgrid", "budget",
                                          f"budget(self.x @ self.w, self.h, {w}, 1)", init="        self.h = 1",
                                          prepare=f"        self.h = 1 + i % {random.randint(2, 4)}")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "clean" if kind == "host" else "hit", "host-sync", lib, path, site)
