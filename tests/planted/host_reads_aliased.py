"""Planted host reads reached through names bound at import (and a twin annotated with NVTX ranges).

A debug barrier imported by name (`from torch.cuda import synchronize`: patching torch.cuda does
not reach that global), beam ids read back through a method alias bound at import (`_tolist =
torch.Tensor.tolist`, a hot-loop micro-optimisation) and the caching allocator trimmed every step
(torch.cuda.empty_cache waits on pending frees; cudaFree synchronizes the device). The twin keeps
the ranked ids on the device and only annotates the step with NVTX ranges, which launch nothing.
"""

import torch
from torch.cuda import nvtx, synchronize

_tolist = torch.Tensor.tolist

V, D, BEAMS = 32, 16, 3


class BeamStep:
    def __init__(self, device):
        self.wa = torch.randn(D, D, device=device) / D**0.5
        self.w = torch.randn(D, V, device=device)
        self.x = torch.zeros(D, device=device)
        self.scores = torch.zeros(BEAMS, device=device)
        self.best = torch.zeros(BEAMS, dtype=torch.long, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(D))

    @torch.no_grad()
    def step(self):
        h = torch.tanh(self.x @ self.wa)
        synchronize()  # HAZARD: host-sync
        top = torch.topk(h @ self.w, BEAMS)
        ranked = _tolist(top.indices)  # HAZARD: host-sync
        self.best.copy_(top.indices)
        self.scores.add_(top.values)
        del h
        torch.cuda.empty_cache()  # HAZARD: host-sync
        return ranked[0]


class BeamStepClean(BeamStep):
    @torch.no_grad()
    def step(self):
        with nvtx.range("attn"):
            h = torch.tanh(self.x @ self.wa)
        nvtx.range_push("beam")
        top = torch.topk(h @ self.w, BEAMS)
        self.best.copy_(top.indices)
        self.scores.add_(top.values)
        nvtx.range_pop()
        nvtx.mark("step")
        return self.best[0]


def make(device):
    return BeamStep(device)


def make_clean(device):
    return BeamStepClean(device)
