"""cpu-side-effect and copy-on-write state objects.

A library that never mutates its bookkeeping in place builds a new state object from the old one on every
call and stores it back (einx's backend registry: `self.state, backend = self.state.get(...)`). The attribute
holds another object after each step, with the same contents: a replay keeping the captured object computes
the same, so that is no finding. A rebind to an object whose contents changed (a position carried in it) is."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_target, marked_line, table

LIB = """
import torch


class _State:
    def __init__(self, prev=None):
        self.names = dict(prev.names) if prev is not None else {{"torch": 1}}
        self.calls = (prev.calls if prev is not None else 0) + {bump}


class _Registry:
    def __init__(self):
        self.state = _State()

    def get(self):
        self.state = _State(self.state)  # LIBSITE
        return self.state.names


registry = _Registry()


def scale(x):
    registry.get()
    return x * 2.0
"""


@pytest.mark.parametrize("kind", ["same", "changed"])
def test_a_state_object_rebuilt_equal_is_no_side_effect(tmp_path, monkeypatch, kind):
    src = LIB.format(bump=0 if kind == "same" else 1)
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, prefix=f"cow_{random.randrange(10**6)}",
                                          names="scale", call="scale(self.x @ self.w)")
    bad = blocking(path, forget=mod)
    if kind == "same":
        assert not len(bad), table(bad)
    else:
        hit = bad[bad.category == "cpu-side-effect"]
        assert len(hit) == 1 and hit.iloc[0].file.endswith(lib.name), table(bad)
        assert int(hit.iloc[0].line) == marked_line(lib, "# LIBSITE"), table(bad)
