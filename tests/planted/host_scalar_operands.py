"""Planted 0-dim host tensors handed to `torch.where` beside device tensors (and a twin that passes numbers).

Binary ops take a 0-dim CPU tensor as a kernel argument, but `torch.where` first moves one to the device of
its other operands (ATen's where_self_out calls `.to(device)`): a copy from pageable host memory inside the
op, which eager decode waits for and capture refuses. The scalar may come from the call's own line, from
another line of the step, or from an attribute the target keeps on the host.
"""

import torch

B, V = 4, 32


class ScalarOperands:
    def __init__(self, device):
        self.w = torch.randn(V, V, device=device)
        self.x = torch.randn(B, V, device=device)
        self.out = torch.zeros(B, V, device=device)
        self.floor = torch.tensor(0.0)  # kept on the host beside device tensors

    def prepare(self, i):
        self.x.normal_()

    @torch.no_grad()
    def step(self):
        logits = self.x @ self.w
        keep = logits > 0
        masked = torch.where(keep, logits, torch.tensor(-1e4))  # HAZARD: pageable-copy
        neg = torch.tensor(float("-inf"))
        top = torch.where(masked > masked.mean(), masked, neg)  # HAZARD: pageable-copy
        clipped = torch.where(top > 0, top, self.floor)  # HAZARD: pageable-copy
        self.out.copy_(clipped * torch.tensor(0.5))
        return self.out


class ScalarOperandsClean(ScalarOperands):
    """The same values, as Python numbers (kernel arguments) or 0-dim tensors made once on the device; a host
    scalar given to `masked_fill` (read on the host) and to a multiply (a kernel argument) copies nothing."""

    def __init__(self, device):
        super().__init__(device)
        self.floor = torch.tensor(0.0, device=device)

    @torch.no_grad()
    def step(self):
        logits = self.x @ self.w
        masked = torch.where(logits > 0, logits, -1e4)
        top = masked.masked_fill(masked <= masked.mean(), torch.tensor(float("-inf")))
        clipped = torch.where(top > 0, top, self.floor)
        self.out.copy_(clipped * torch.tensor(0.5))
        return self.out


def make(device):
    return ScalarOperands(device)


def make_clean(device):
    return ScalarOperandsClean(device)
