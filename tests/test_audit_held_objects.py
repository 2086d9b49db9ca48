"""A plain object held by a library object of the target, changed by the holder's method.

A cache keeps its bookkeeping in a dataclass (`self.info = StepInfo()`) and advances it in its own method
(`self.info.tokens += n`). The snapshot names the change by the held object (`cache.info`, `tokens`), whose
class has no statement, so the finding had no source line ("<python state>"). The holder's class is searched
for statements through the holding name: the finding is at that line, with the target's call as caller; a
method that only reads the counter is clean, also for an object held two levels down (`self.meta.inner.tokens`).
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
from dataclasses import dataclass


@dataclass
class {info}:
    tokens: int = 0
    steps: int = 0


class Box:
    def __init__(self):
        self.inner = {info}()


class Cache:
    def __init__(self):
        self.{held} = {make}
        self.tokens = 0

    def note(self, x, n):
        self.{held}{path}.{attr} += n  # LIBSITE
        return x

    def peek(self, x, n):
        return x * (1.0 if self.{held}{path}.{attr} >= 0 else 0.0)
"""


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_holder_method_changing_a_held_object(tmp_path, monkeypatch, kind, depth):
    info, held = random.choice(["StepInfo", "Meta"]), random.choice(["info", "stats", "meta"])
    attr = random.choice(["tokens", "steps"])
    meth = "note" if kind == "hit" else "peek"
    nested = depth == 2  # `self.meta.inner.tokens`: held two levels down
    src = LIB.format(info=info, held=held, attr=attr, make="Box()" if nested else f"{info}()",
                     path=".inner" if nested else "")
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "held",
                                          "Cache", f"self.cache.{meth}(self.x @ self.w, {random.randint(1, 4)})",
                                          init="        self.cache = Cache()")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "cpu-side-effect", lib, path, site)
