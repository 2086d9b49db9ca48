"""data-dependent-control: one finding for an inner loop's trip count, none for the frame loop around it.

A transducer decodes a chunk frame by frame (`for t in range(T): self.frame(frames[:, t])`), each frame running
up to `max_symbols` joint steps, a cap set per request. Aligning a step of one trip per frame against one of two,
difflib lines the short step's frames up against the long step's extra trips and leaves each frame's own ops
(`frames[:, t]`, the mask it starts with) as small differing regions, though both steps ran them T times. Those
are the alignment's doing: only the inner loop is named, not the frame loop."""

from __future__ import annotations

import random

from site_util import blocking, install_library, marked_line, module_target, table, write_target

LIB = """
import torch
from torch import nn


class Greedy(nn.Module):
    def __init__(self, d, v):
        super().__init__()
        self.joint = nn.Linear(d, v)
        self.emb = nn.Embedding(v, d)
        self.register_buffer("g", torch.zeros(1, d))
        self.max_symbols = 2

    def frame(self, f):
        active = torch.ones(f.shape[0], dtype=torch.bool, device=f.device)
        for _ in range(self.max_symbols):  # INNER
            k = self.joint(f + self.g).argmax(-1)
            active = active & (k != 0)
            self.g.copy_(torch.where(active[:, None], self.emb(k), self.g))

    def forward(self, frames):
        for t in range(frames.shape[1]):  # FRAMES
            self.frame(frames[:, t])
        return frames.mean(1)
"""


def test_only_the_inner_loop_is_named(tmp_path, monkeypatch):
    d, v, n_frames = random.choice([4, 8]), random.choice([8, 16]), random.choice([4, 6, 8])
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="shifted")
    tpl = module_target(imports=f"from {mod} import Greedy",
                        init=f"        self.gr = Greedy({d}, {v})\n        self.frames = torch.zeros(1, {n_frames}, {d})",
                        prepare=f"        self.frames.copy_(torch.randn(1, {n_frames}, {d}))\n"
                                f"        self.gr.max_symbols = 1 + i % 2",
                        step="        y = self.gr(self.frames)  # SITE\n        self.out.copy_(y)")
    path, site = write_target(tmp_path / "target" / "shifted.py", tpl, seed=random.randrange(2**31), d=d)
    bad = blocking(path, forget=mod)
    ddc = bad[bad.category == "data-dependent-control"]
    assert set(ddc.line) == {marked_line(lib, "# INNER")}, table(bad)
    assert (ddc.caller_line == site).all(), table(bad)
