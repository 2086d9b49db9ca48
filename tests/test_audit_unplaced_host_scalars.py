"""baked-host-value: a 0-dim tensor a plain library object makes with a factory naming no device.

A temperature processor keeping `self.t = torch.tensor(t)` in a class that names no device at all: torch's
default device is the CPU (the target set none), so on a GPU it is a host tensor, and `scores / self.t` reads
it as a kernel scalar at launch. Annealed per request (`self.proc.t.fill_(...)` in prepare()), a graph keeps
the capture step's value. Constant, it bakes nothing; replaced by the target (`self.proc.t = ...`, often
`.to(device)`), where it lives is the target's choice, which the class's source no longer tells."""

from __future__ import annotations

import random

import pytest
from site_util import blocking, clean_or_hit, install_library, matmul_target, write_target

LIB = """
import torch


class HostTemp:
    def __init__(self, t):
        self.t = torch.{factory}

    def __call__(self, scores):
        return scores {op} self.t  # LIBSITE
"""


@pytest.mark.parametrize("kind", ["hit", "clean", "moved"])
def test_zero_dim_scalar_of_an_unplaced_object(tmp_path, monkeypatch, kind):
    t0 = round(random.uniform(0.5, 1.5), 2)
    factory = random.choice([f"tensor({t0})", f"full((), {t0})", f"scalar_tensor({t0})"])
    src = LIB.replace("{factory}", factory).replace("{op}", random.choice(["/", "*"]))
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="hosttemp")
    init = "        self.proc = HostTemp(1.0)" + ("\n        self.proc.t = self.proc.t.clone()" if kind == "moved" else "")
    prepare = "" if kind == "clean" else "        self.proc.t.fill_(0.5 + 0.1 * (i % 3))"
    tpl = matmul_target(imports=f"from {mod} import HostTemp", init=init, prepare=prepare,
                        step="        y = self.proc(self.x @ self.w)  # SITE\n        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "hosttemp_target.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "hit" if kind == "hit" else "clean", "baked-host-value", lib, path, site)
