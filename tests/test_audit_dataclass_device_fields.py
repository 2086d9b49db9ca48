"""pageable-copy on a CPU scan: `torch.tensor(ids, device=self.device)` in a dataclass whose `device` field
defaults to "cpu".

A constraint spec (`@dataclass class Constraint: ids: list; device: str = "cpu"`) builds its tensor in
`__post_init__`. The field is a parameter of the generated `__init__`: the target passes its device
(`Constraint(ids, self.device)`, positionally or by keyword), so the "cpu" default says nothing about where
the tensor goes, and made in the step it is a copy from pageable memory. Made once in make(), it is none. A
field declared with `field(init=False, default="cpu")` cannot be passed, and stays the CPU."""

from __future__ import annotations

import random

import pytest
from site_util import blocking, clean_or_hit, install_library, matmul_target, table, write_target

LIB = """
from dataclasses import dataclass, field

import torch


@dataclass
class Constraint:
    ids: list
    {field}
    tensor: torch.Tensor = field(init=False)

    def __post_init__(self):
        self.tensor = torch.tensor(self.ids, device=self.{name})  # LIBSITE
"""


@pytest.mark.parametrize("kind", ["hit", "clean"])
def test_dataclass_device_field_passed_by_the_target(tmp_path, monkeypatch, kind):
    name = random.choice(["device", "dev"])
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{field}", f'{name}: str = "cpu"').replace("{name}", name),
                               prefix="spec")
    ids = sorted(random.sample(range(4), 2))
    make = random.choice([f"Constraint({ids}, str(self.x.device))", f"Constraint({ids}, {name}=str(self.x.device))"])
    if kind == "hit":
        init, step = "", f"        c = {make}  # SITE\n        y = (self.x @ self.w).index_fill(1, c.tensor, 0.0)\n"
    else:
        init = f"        self.c = {make}"
        step = "        y = (self.x @ self.w).index_fill(1, self.c.tensor, 0.0)  # SITE\n"
    tpl = matmul_target(imports=f"from {mod} import Constraint", init=init,
                        step=step + "        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "spec_target.py", tpl, seed=random.randrange(2**31), d=4)
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "pageable-copy", lib, path, site)


def test_a_field_no_caller_can_set_keeps_its_cpu_default(tmp_path, monkeypatch):
    src = LIB.replace("{field}", 'device: str = field(init=False, default="cpu")').replace("{name}", "device")
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="spec_fixed")
    tpl = matmul_target(imports=f"from {mod} import Constraint",
                        step="        c = Constraint([1, 2])  # SITE\n        y = (self.x @ self.w) + c.tensor.sum()\n"
                             "        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "spec_fixed_target.py", tpl, seed=random.randrange(2**31), d=4)
    bad = blocking(path, forget=mod)
    assert not (bad.category == "pageable-copy").any(), table(bad)
