"""Planted explicit CUDA wait. On a CPU-only torch an unpatched torch.cuda.synchronize() raises,
so scan this with warmup=0: during audited steps the patched call records and returns."""

import torch


class CudaWait:
    """torch.cuda.synchronize in the step (scan it with warmup=0 on a CPU-only machine)."""

    def __init__(self, device):
        self.x = torch.zeros(8, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(8))

    def step(self):
        y = self.x * 2
        torch.cuda.synchronize()  # HAZARD: host-sync
        return y


def make(device):
    return CudaWait(device)
