"""pageable-copy: a tensor attribute a library class makes from numpy data and moves to the device per call.

A front end keeping its mel filterbank as a plain attribute (`self.fb_host = torch.from_numpy(fb)`, not a
registered buffer, so `module.to(device)` leaves it on the host) and moving it in forward
(`self.fb_host.to(x.device) @ spec`) copies from pageable memory at every call: `torch.from_numpy` always
makes a host tensor, as a factory naming no device does. A CPU scan sees no copy, so the source decides.
The twin registers the same array as a buffer (moved with the module): clean."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, module_target, write_target

LIB = """
import numpy as np
import torch
from torch import nn


class {cls}(nn.Module):
    def __init__(self, d, buffered):
        super().__init__()
        arr = np.linspace(0.0, 1.0, d * d, dtype=np.float32).reshape(d, d)
        self.buffered = buffered
        if buffered:
            self.register_buffer("{attr}", torch.from_numpy(arr))
        else:
            self.{attr} = torch.{fn}({src})

    def forward(self, x):
        if self.buffered:
            return x @ self.{attr}
        return x @ self.{attr}.to(x.device).view(x.shape[-1], -1)  # LIBSITE
"""


@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_numpy_made_attribute_moved_per_call_is_a_pageable_copy(tmp_path, monkeypatch, kind):
    cls, attr = random.choice(["Fbank", "MelProj"]), random.choice(["fb_host", "table", "weights_np"])
    fn, src = random.choice([("from_numpy", "arr"), ("frombuffer", "bytearray(arr.tobytes()), dtype=torch.float32")])
    d = random.choice([4, 8])
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(cls=cls, attr=attr, fn=fn, src=src), prefix="npattr")
    tpl = module_target(imports=f"from {mod} import {cls}",
                        init=f"        self.fe = {cls}({d}, {kind == 'clean'})",
                        step="        y = self.fe(self.x)  # SITE\n        self.out.copy_(y)")
    path, site = write_target(tmp_path / "target" / "npattr.py", tpl, seed=random.randrange(2**31), d=d)
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "pageable-copy", lib, path, site)
