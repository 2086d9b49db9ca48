"""pageable-copy: `torch.zeros(...).to(v)`, a host-made buffer moved to another tensor's device.

fla's naive recurrent references build their outputs as `o = torch.zeros(B, H, T, V).to(v)` and then
fill them in place (`o[:, :, i] = ...`). On a GPU the `.to(v)` is a copy from pageable host memory
(capture refuses it), and `o` is a device tensor from there on. A CPU scan saw neither: `.to(tensor)`
was not taken for a move to that tensor's device, so the move went unreported, while the writes into
`o` were called device->host copies into a host buffer and the caller's `out.copy_(o)` a host->device
copy. The move is now the one finding, at its line; memory sent on with `.to(D)` is the device copy
from there on."""

from __future__ import annotations

import random

import pytest
from site_util import blocking, clean_or_hit, library_target, table

LIB = """
import torch


def recurrent(x, state):
    n, d = x.shape
    {make}  # LIBSITE
    h = state.clone()
    for i in range(n):
        h = h * {decay} + x[i]
        o[i] = h.tanh()
    return o, h
"""


@pytest.mark.parametrize("kind", ["to_tensor", "to_device", "clean"])
def test_a_host_buffer_moved_to_a_tensors_device_is_one_pageable_copy(tmp_path, monkeypatch, kind):
    make = {"to_tensor": "o = torch.zeros(n, d).to(x)",
            "to_device": "o = torch.zeros(n, d).to(x.device)",
            "clean": "o = x.new_zeros(n, d)"}[kind]
    src = LIB.format(make=make, decay=round(random.uniform(0.3, 0.9), 3))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "tolike", "recurrent",
                                          "recurrent(self.x @ self.w, self.x[0])", out="y[0]")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "pageable-copy", lib, path, site)
    assert set(bad.category) <= {"pageable-copy"} and len(bad) == (kind != "clean"), table(bad)
