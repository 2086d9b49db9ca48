"""A dataclass's tensor field made in host memory by its constructor's callers, moved to the device in the step.

A quantized weight keeps its state in a dataclass (bitsandbytes' `QuantState(code, absmax, ...)`): a codebook
made by a host factory in the function that builds the state (`torch.tensor(NF4)`, directly, through a local,
or through a helper returning it) and moved to the device at every dequantize (`qs.code.to(x.device)`). On a GPU
that copies from pageable memory, which capture refuses. The dataclass's generated `__init__` has no source, so
the attribute rules found no factory and a CPU scan reported nothing. The constructions of the dataclass in its
file say how the field was made: pageable-copy at the move; a codebook made on the device is clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, matmul_target, write_target

LIB = """
from dataclasses import dataclass

import torch

TABLE = [{table}]


def codebook():
    return torch.tensor(TABLE)


@dataclass
class {state}:
    {field}: torch.Tensor
    scale: float


def build(device):
    {build}


def lookup(st, x):
    code = st.{field}.to(x.device)  # LIBSITE
    return x + code.sum() * st.scale
"""

BUILDS = {"direct": "return {state}(torch.tensor(TABLE), 0.5)",
          "local": "table = codebook()\n    return {state}(table, 0.5)",
          "helper": "return {state}({field}=codebook(), scale=0.5)",
          "device": "return {state}(torch.tensor(TABLE, device=device), 0.5)"}


@pytest.mark.parametrize("made", ["direct", "local", "helper", "device"])
def test_dataclass_field_made_on_the_host(tmp_path, monkeypatch, made):
    names = dict(state=random.choice(["QuantState", "CodeState"]), field=random.choice(["code", "lut"]))
    table = ", ".join(f"{random.uniform(-1, 1):.3f}" for _ in range(random.choice([4, 8, 16])))
    src = LIB.format(table=table, build=BUILDS[made].format(**names), **names)
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="dc")
    tpl = matmul_target(imports=f"from {mod} import build, lookup", init="        self.st = build('cpu')",
                        step="""        y = lookup(self.st, self.x @ self.w)  # SITE
        self.out.copy_(y)
        return self.out""")
    path, site = write_target(tmp_path / "target" / "dc.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "clean" if made == "device" else "hit", "pageable-copy", lib, path, site)
