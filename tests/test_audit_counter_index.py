"""baked-host-value on a line a counter-driven branch skips in some iterations, when the line also reads the counter.

Multi-rate codes (a coarse codebook every 4th frame, a finer one every 2nd, the finest every frame) are written at
`self.codes[j][self.frame // s]` under `if self.frame % s == 0:`. The steps run the loop body a different number
of times, so the k-th write is another scale in another step: baked.py leaves such a changing loop index to
data-dependent-control. But the position also comes from the Python frame counter, which moves whatever
iterations run, so it is a baked value of its own at that line. A loop skipping by the same branch but writing at
an index read from the loop alone still leaves the branch as the only finding there, and the graph-safe twin (a
device frame counter, a dump slot for the off-frames) has none.
"""

from __future__ import annotations

import random

from site_util import blocking, marked_line, table, write_target

HEAD = """
import torch
from torch import nn

STRIDES = {strides}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.head = nn.Linear({d}, 16)
        self.x = torch.zeros(1, {d})
"""

HAZARD = HEAD + """
        self.codes = [torch.zeros(256, dtype=torch.long) for _ in STRIDES]
        self.frame = 0

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        for j, s in enumerate(STRIDES):
            if self.frame % s == 0:  # BRANCH
                self.codes[j][self.frame // s] = self.head(self.x)[0].argmax()  # SITE
        self.frame += 1


def make(device):
    return Target()
"""

LOCAL = HAZARD.replace("        for j, s in enumerate(STRIDES):\n", "        t = self.frame\n        for j, s in enumerate(STRIDES):\n") \
    .replace("[self.frame // s]", "[t // s]")

LOOP_ONLY = HEAD + """
        self.last = torch.zeros(len(STRIDES), dtype=torch.long)
        self.frame = 0

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        for j, s in enumerate(STRIDES):
            if self.frame % s == 0:  # BRANCH
                self.last[j] = self.head(self.x)[0].argmax()  # SITE
        self.frame += 1


def make(device):
    return Target()
"""

CLEAN = HEAD + """
        self.codes = [torch.zeros(257, dtype=torch.long) for _ in STRIDES]
        self.frame = torch.zeros(1, dtype=torch.long)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        for j, s in enumerate(STRIDES):
            on = self.frame % s == 0
            slot = torch.where(on, (self.frame // s).clamp(max=255), 256)
            self.codes[j].index_copy_(0, slot, self.head(self.x).argmax(-1))  # SITE
        self.frame.add_(1)


def make(device):
    return Target()
"""


def _fields():
    return dict(seed=random.randrange(10**6), d=random.choice([8, 12, 16]),
                strides=random.choice(["(4, 2, 1)", "(2, 1)", "(3, 1)"]))


def test_counter_position_under_a_counter_branch_is_baked_at_its_line(tmp_path):
    for name, src in (("direct", HAZARD), ("local", LOCAL)):
        path, site = write_target(tmp_path / f"multirate_{name}.py", src, **_fields())
        bad = blocking(path)
        got = set(zip(bad.line.astype(int), bad.category))
        assert (site, "baked-host-value") in got, table(bad)
        assert (marked_line(path, "# BRANCH"), "data-dependent-control") in got, table(bad)


def test_loop_index_alone_stays_the_branchs_finding(tmp_path):
    path, site = write_target(tmp_path / "multirate_loop_only.py", LOOP_ONLY, **_fields())
    bad = blocking(path)
    assert not ((bad.line == site) & (bad.category == "baked-host-value")).any(), table(bad)
    assert ((bad.line == marked_line(path, "# BRANCH")) & (bad.category == "data-dependent-control")).any(), table(bad)


def test_device_counter_twin_is_graph_ready(tmp_path):
    path, _ = write_target(tmp_path / "multirate_clean.py", CLEAN, **_fields())
    bad = blocking(path)
    assert bad.empty, table(bad)
