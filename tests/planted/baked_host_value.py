"""Planted baked-host-value hazards (and a graph-safe twin): Python values that change per step.

prepare(i) sets the decode position as a Python int (host-side staging is fine); the hazard is
that the step turns it into kernel arguments, which a graph would freeze at capture. That holds
wherever the value enters: a scalar operand, a slice bound, a view / arange / allocation size;
when it also sets a shape, the line is a dynamic-shape finding too (each finding with its own fix).
A cache that grows now and then still bakes the position into the steps between its growths.
"""

import torch


class Baked:
    def __init__(self, device):
        self.table = torch.zeros(4, 8, device=device)
        self.x = torch.zeros(8, device=device)
        self.pos = 0
        self.cache = torch.zeros(4, 8, device=device)

    def prepare(self, i):
        self.table.copy_(torch.randn(4, 8))
        self.x.copy_(torch.randn(8))
        self.pos = 5 + i
        if i == 3:  # a cache that grows now and then (rebuilt outside the step)
            self.cache = torch.randn(8, 8, device=self.x.device)

    def step(self):
        pos = self.pos
        a = torch.arange(pos, pos + 2, device=self.x.device)  # HAZARD: baked-host-value
        col = self.table[:, pos % 8]  # HAZARD: baked-host-value
        sel = torch.index_select(self.table, 1, torch.tensor([pos % 8], device=self.x.device))  # HAZARD: baked-host-value, pageable-copy
        scaled = self.x * (1.0 / (pos + 1))  # HAZARD: baked-host-value
        filled = torch.full((2,), float(pos), device=self.x.device)  # HAZARD: baked-host-value
        window = self.x.narrow(0, pos % 4, 4)  # HAZARD: baked-host-value
        blocks = torch.tensor([(pos + j) // 4 for j in range(32)], device=self.x.device)  # HAZARD: baked-host-value, pageable-copy
        head = self.x[: pos % 4 + 1]  # HAZARD: baked-host-value, dynamic-shape
        ramp = torch.arange(pos % 3 + 1, dtype=torch.float32, device=self.x.device)  # HAZARD: baked-host-value, dynamic-shape
        grid = self.x.view(pos % 2 + 1, -1)  # HAZARD: baked-host-value, dynamic-shape
        tail = self.table.new_zeros(pos % 5 + 1)  # HAZARD: baked-host-value, dynamic-shape
        row = self.cache[pos % 4]  # HAZARD: baked-host-value, stale-input-pointer
        return (a.sum() + col.sum() + sel.sum() + scaled.sum() + filled.sum() + window.sum() + blocks.sum()
                + head.sum() + ramp.sum() + grid.sum() + tail.sum() + row.sum())


class BakedClean:
    """The position lives in a device tensor that prepare() updates in place."""

    def __init__(self, device):
        self.table = torch.zeros(4, 8, device=device)
        self.x = torch.zeros(8, device=device)
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        self.offsets = torch.arange(4, device=device)
        self.idx = torch.arange(8, device=device)

    def prepare(self, i):
        self.table.copy_(torch.randn(4, 8))
        self.x.copy_(torch.randn(8))
        self.pos.fill_(5 + i)

    def step(self):
        pos = self.pos
        a = pos + self.offsets[:2]
        col = torch.index_select(self.table, 1, (pos % 8).reshape(1))
        scaled = self.x / (pos + 1)
        filled = pos.float().expand(2)
        window = self.x.gather(0, pos % 4 + self.offsets)
        head = torch.where(self.idx < pos % 4 + 1, self.x, 0.0)  # static maximum, masked by the device value
        ramp = torch.where(self.idx[:3] < pos % 3 + 1, self.idx[:3].float(), 0.0)
        grid = self.x.view(2, -1) * (pos % 2 + 1)
        tail = torch.zeros(5, device=self.x.device) * (pos % 5 + 1)
        return (a.sum() + col.sum() + scaled.sum() + filled.sum() + window.sum()
                + head.sum() + ramp.sum() + grid.sum() + tail.sum())


def make(device):
    return Baked(device)


def make_clean(device):
    return BakedClean(device)
