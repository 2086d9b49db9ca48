"""Planted device-guarded waits a CPU scan never runs (and a graph-safe twin).

A wait behind `if x.is_cuda:` runs on the GPU inside the captured region. A wait behind
`not torch.cuda.is_current_stream_capturing()` is skipped exactly while a graph is captured, so it
never reaches a capture (a serving engine's profiling sync): not a finding; Python bookkeeping
under the same guard counts eager steps only (info).
"""

import torch
from torch import nn


class Guarded:
    def __init__(self, device):
        self.lin = nn.Linear(8, 8).to(device)
        self.x = torch.zeros(2, 8, device=device)
        self.profile = True
        self.eager_steps = 0

    def prepare(self, i):
        self.x.copy_(torch.randn(2, 8))

    def _timing_sync(self, y):
        if y.is_cuda and not torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
        if torch.cuda.is_current_stream_capturing() or not y.is_cuda:
            return y
        else:
            torch.cuda.current_stream().synchronize()
        if not torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()  # traced on an eager scan, never reached by a capture
        return y

    @torch.no_grad()
    def step(self):
        y = self._timing_sync(self.lin(self.x))
        if y.is_cuda:
            torch.cuda.synchronize()  # HAZARD: host-sync
        if not torch.cuda.is_current_stream_capturing():
            self.eager_steps += 1  # eager-only bookkeeping: info, a capture never runs it
        return y


class GuardedClean(Guarded):
    @torch.no_grad()
    def step(self):
        return self._timing_sync(self.lin(self.x))


def make(device):
    return Guarded(device)


def make_clean(device):
    return GuardedClean(device)
