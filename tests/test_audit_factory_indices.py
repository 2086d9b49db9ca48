"""A device tensor indexed by ids that torch factories built on the host in the step.

Qwen2-VL's vision rotary builds row and column ids with `torch.arange(h)` / `torch.arange(w)` (no device),
stacks them and indexes a rotary table kept on the device (`self.table[ids]`): on a GPU the index is in host
memory and advanced indexing copies it to the device from pageable memory, which capture refuses
(`index_select` is not this: its device check refuses a host index outright). The same ids built with
`device=` the table's device are clean, and so is indexing a table the class keeps in host memory.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch


class Rotary:
    def __init__(self, n, d, device):
        self.w = torch.zeros(d, device=device)
        self.table = torch.randn(n, d{tdev})

    def __call__(self, x, h, w):
        dev = self.table.device
        hpos = torch.arange(h{dev}).unsqueeze(1).expand(-1, w).flatten()
        wpos = torch.arange(w{dev}).unsqueeze(0).expand(h, -1).flatten()
        ids = {combine}
        rows = {index}  # LIBSITE
        return x * (1.0 + 0.01 * rows.sum())
"""

COMBINE = ["torch.stack([hpos, wpos], -1).flatten()", "hpos * {w} + wpos", "torch.cat([hpos, wpos])"]
INDEX = ["self.table[ids]", "self.table[ids].clone()", "torch.stack([self.table[ids]])"]


@pytest.mark.parametrize("kind", ["hit", "device_ids", "host_table"])
def test_factory_index(tmp_path, monkeypatch, kind):
    h, w = random.randint(1, 3), random.randint(1, 3)
    src = LIB.format(dev=", device=dev" if kind == "device_ids" else "",
                     tdev="" if kind == "host_table" else ", device=device",
                     combine=random.choice(COMBINE).format(w=w), index=random.choice(INDEX))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "rotidx", "Rotary",
                                          f"self.rot(self.x @ self.w, {h}, {w})",
                                          init=f"        self.rot = Rotary({h * w + 4}, 4, self.x.device)")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "hit" if kind == "hit" else "clean", "pageable-copy", lib, path, site)
