"""A class attribute a constructor changes, when the step makes an instance.

A library helper builds a small object per call inside the step (`Normalizer(x.device)(x)`) whose `__init__`
counts instances on the class (`Normalizer.made += 1`). Statements in `__init__` are set-up made in make() as
a rule, but a class attribute that changed during a step changed in a constructor the step ran: the `__init__`
line is the site, with the target's call as caller, whether `__init__` runs torch ops or not, and whether the
helper or the target itself constructs the object. Made once in make(), the same class is clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch


class {cls}:
    {counter} = 0

    def __init__(self, device):
        {cls}.{counter} += 1  # LIBSITE
        {body}

    def __call__(self, x):
        return x * 0.5


def apply(x):
    return {cls}(x.device)(x)
"""

BODIES = ["self.scale = torch.full((1,), 0.5, device=device)", "self.device = device", "pass"]


@pytest.mark.parametrize("where", ["helper", "target", "make"])
def test_constructor_counts_on_class(tmp_path, monkeypatch, where):
    cls, counter = random.choice(["Normalizer", "Resizer", "PatchOp"]), random.choice(["made", "instances", "count"])
    src = LIB.format(cls=cls, counter=counter, body=random.choice(BODIES))
    call = {"helper": "apply(self.x @ self.w)", "target": f"{cls}(self.x.device)(self.x @ self.w)",
            "make": "self.op(self.x @ self.w)"}[where]
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "ctor", f"{cls}, apply", call,
                                          init=f"        self.op = {cls}(self.x.device)")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "clean" if where == "make" else "hit", "cpu-side-effect", lib, path, site)
