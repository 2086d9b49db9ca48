"""The caller of a change a library method makes, running no torch op, to an object its holder keeps.

A request table (`self.table = Table()`) whose `bump()` advances `self.reqs[rid].generated += 1` (a dataclass
per request) runs no op, so no traced frame leads into it: the caller is read from the target's source, from
its calls of methods on `self.table`. When the target calls several of them (`self.table.scale(x)` first,
which runs ops, then `self.table.bump()`), the call of the method that holds the statement is the caller,
not the first call on the object."""

from __future__ import annotations

import random

from site_util import blocking, install_library, library_hit, matmul_target, write_target

LIB = """
from dataclasses import dataclass

import torch


@dataclass
class Req:
    rid: int
    generated: int = 0


class Table:
    def __init__(self, n):
        self.reqs = {r: Req(r) for r in range(n)}
        self.scale_by = torch.ones(1)

    def scale(self, x):
        return x * self.scale_by

    def NAME(self):
        for rid in self.reqs:
            self.reqs[rid].generated += 1  # LIBSITE

    def size(self):
        return len(self.reqs)
"""


def test_the_call_of_the_changing_method_is_the_caller(tmp_path, monkeypatch):
    name = random.choice(["bump", "note_generated", "advance"])
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("NAME", name), prefix="reqtable")
    before = random.choice(["        y = self.table.scale(self.x)\n", "        y = self.table.scale(self.x) * self.table.size()\n"])
    tpl = matmul_target(imports=f"from {mod} import Table", init=f"        self.table = Table({random.randint(2, 5)})",
                        step=before + f"        self.table.{name}()  # SITE\n        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "reqtable_target.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    library_hit(bad, "cpu-side-effect", lib, path, site)
