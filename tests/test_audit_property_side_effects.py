"""A library property that changes host state when read (a block table's `next_slot` advancing a host cursor) or
set (a setter counting writes) runs by attribute syntax alone, with no call that names it: the cpu-side-effect is
at the property's statement, with the target's line that reads (or sets) the attribute as caller. A property
that only reads is no finding."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_hit, library_target, table

LIB = """
import functools

import torch

class Table:
    def __init__(self, n):
        self.{cursor} = 0
        self.n = n
        self.scale = torch.ones(1)

    @property
    def {prop}(self):
        self.{cursor} = (self.{cursor} + 1) % self.n  # LIBSITE_GET
        return self.{cursor}

    @{prop}.setter
    def {prop}(self, v):
        self.{cursor} = v % self.n  # LIBSITE_SET

    @property
    def size(self):
        return self.n

    def other(self):
        self.{cursor} = 0
"""


@pytest.mark.parametrize("kind", ["get", "set", "read-only"])
def test_a_property_changing_host_state(tmp_path, monkeypatch, kind):
    prop, cursor = random.choice(["next_slot", "cursor_pos", "advance"]), random.choice(["_cursor", "_pos", "_i"])
    src = LIB.replace("{prop}", prop).replace("{cursor}", cursor)
    n = random.randint(3, 9)
    call = {"get": f"self.tab.{prop} * 0 + torch.tanh(self.x @ self.w)",
            "read-only": "self.tab.size * 0 + torch.tanh(self.x @ self.w)",
            "set": "torch.tanh(self.x @ self.w)"}[kind]
    init = f"        self.tab = Table({n})\n        self.w = torch.randn({{d}}, {{d}})\n        self.k = 0"
    prepare = "        self.k = i" if kind == "set" else ""
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "proptab", "Table", call, init=init,
                                          prepare=prepare)
    if kind == "set":  # the setter runs on a line of its own, before the marked one
        text = path.read_text().replace("        y = torch.tanh", f"        self.tab.{prop} = self.k + 1  # SET\n        y = torch.tanh")
        path.write_text(text)
        site = next(n for n, t in enumerate(text.splitlines(), 1) if "# SET" in t)
    bad = blocking(path, forget=mod)
    if kind == "read-only":
        assert not len(bad), table(bad)
        return
    library_hit(bad, "cpu-side-effect", lib, path, site, marker="# LIBSITE_GET" if kind == "get" else "# LIBSITE_SET")
    assert len(bad) == 1, table(bad)
