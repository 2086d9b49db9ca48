"""An object handed to a module call and changed by a library hook torch runs from that call.

A `with_kwargs` forward hook advancing the cache it finds in the call's keyword arguments
(`kwargs["cache"].offset += 1`) runs no torch op, so no op record carries its frame; the search for the
statement that changed `cache.offset` looked in the functions that ran ops, found none there, and fell
back to the cache class's own method that advances it, which never ran in the step. The hooks torch ran
from the step's module calls count as functions that ran: the finding is at the hook's line, with the
target's call of the module as caller; a hook that only reads the cache is clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, module_target, write_target

LIB = """
import torch
from torch import nn


class {cache}:
    def __init__(self):
        self.{attr} = 0

    def advance(self):
        self.{attr} += 1


class Mixer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x, cache=None):
        return self.proj(x)


def advancing_hook(module, args, kwargs, out):
    kwargs["cache"].{attr} += {k}  # LIBSITE


def reading_hook(module, args, kwargs, out):
    return out * (1.0 if kwargs["cache"].{attr} >= 0 else 1.0)


def install(mixer, advancing):
    mixer.register_forward_hook(advancing_hook if advancing else reading_hook, with_kwargs=True)
"""


@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_hook_changing_a_handed_object_is_the_site(tmp_path, monkeypatch, kind):
    cache, attr = random.choice(["SeqCache", "StateCache"]), random.choice(["offset", "seen", "pos"])
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(cache=cache, attr=attr, k=random.randint(1, 3)),
                               prefix="hookobj")
    d = random.choice([4, 8])
    tpl = module_target(imports=f"from {mod} import {cache}, Mixer, install",
                        init=f"        self.cache = {cache}()\n        self.mix = Mixer({d})\n"
                             f"        install(self.mix, {kind == 'hit'})",
                        step="        y = self.mix(self.x, cache=self.cache)  # SITE\n        self.out.copy_(y)")
    path, site = write_target(tmp_path / "target" / "hookobj.py", tpl, seed=random.randrange(2**31), d=d)
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "cpu-side-effect", lib, path, site)
