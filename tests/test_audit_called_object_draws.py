"""A host draw inside the `__call__` of a library object the target calls by syntax, running no torch op.

A speculative-acceptance object (`self.acc = HostCoin(p)`, `tok = self.acc(draft, target)`; a member of a list
or dict attribute, `self.accs[0](d, t)`; or handed to a library function that calls it) that flips
`random.random()` and returns one of its tensor arguments runs no op: the trace holds no frame of it. The draw
advances Python's global generator all the same, and a replay never draws again: a cpu-side-effect at the
drawing line, with the target's call of the object as caller. The same object drawing nothing, or from a
generator it makes and drops in the call, is no finding."""

from __future__ import annotations

import random

import pytest
from site_util import blocking, clean_or_hit, library_target

LIB = """
import random
import numpy as np
import torch


class HostCoin:
    def __init__(self, p):
        self.p = p

    def __call__(self, a, b):
        {draw}  # LIBSITE
        return a if u < self.p else b


def speculate(acc, a, b):
    return acc(a * 1.0, b)
"""

# how the target reaches the object: (its attribute's value, the call on the marked line)
HOW = {"attr": ("HostCoin({p})", "self.acc(self.x * 2, self.x)"),
       "list": ("[HostCoin({p})]", "self.acc[0](self.x * 2, self.x)"),
       "dict": ("{{{{'spec': HostCoin({p})}}}}", "self.acc['spec'](self.x * 2, self.x)"),
       "handed": ("HostCoin({p})", "speculate(self.acc, self.x * 2, self.x)")}

DRAWS = {"hit": ["u = random.random()", "u = random.uniform(0.0, 1.0)", "u = np.random.rand()"],
         "clean": ["u = self.p * 0.5", "u = random.Random(0).random()"]}


@pytest.mark.parametrize("how", sorted(HOW))
@pytest.mark.parametrize("kind", ["hit", "clean"])
def test_draw_in_a_called_library_object(tmp_path, monkeypatch, kind, how):
    src = LIB.replace("{draw}", random.choice(DRAWS[kind]))
    held, call = HOW[how]
    held = held.format(p=round(random.uniform(0.2, 0.8), 2))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "coin", "HostCoin, speculate", call,
                                          init=f"        self.acc = {held}")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "cpu-side-effect", lib, path, site)
