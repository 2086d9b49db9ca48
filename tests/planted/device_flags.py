"""Planted waits behind device tests spelled without "cuda" (and a graph-safe twin).

A CPU scan never takes a branch that runs only on an accelerator, so the auditor reads the `if`:
a comparison with a device (`y.device != torch.device("cpu")`), or a flag assigned a device test
in __init__ (`self.on_accelerator = torch.device(device).type != "cpu"`), in the step, or at module
level. A flag on ordinary data is no device test, whatever its name: its untaken branch is not
a finding (`self.log_cuda_stats = False`). Where the GPU takes a branch that divides by a value read
back, the value is also baked into a capture (a CUDA-scan finding: the CPU scan reads that branch only).
"""

import torch
from torch import nn

ACCELERATED = torch.cuda.is_available()


class Flags:
    def __init__(self, device):
        self.lin = nn.Linear(8, 8).to(device)
        self.x = torch.zeros(2, 8, device=device)
        self.on_accelerator = torch.device(device).type != "cpu"
        self.remote = device != "cpu"
        self.log_cuda_stats = False
        self.verbose = False

    def prepare(self, i):
        self.x.copy_(torch.randn(2, 8))

    @torch.no_grad()
    def step(self):
        y = self.lin(self.x)
        if self.log_cuda_stats:  # an ordinary flag (named for cuda, assigned False): not a device test
            print(y.abs().max().item())
        if self.verbose or y.shape[0] > 99:  # data, not the device
            torch.cuda.synchronize()
        if y.device != torch.device("cpu"):
            torch.cuda.current_stream().synchronize()  # HAZARD: host-sync
        if self.on_accelerator:
            torch.cuda.synchronize()  # HAZARD: host-sync
        if self.remote and y.numel() > 0:
            y = y / y.abs().max().item()  # HAZARD: host-sync  # CUDA: baked-host-value
        fast = y.device.type in ("cuda", "xpu")
        if not fast:
            y = y * 1.0
        else:
            y.sum().tolist()  # HAZARD: host-sync
        if ACCELERATED:
            torch.cuda.synchronize()  # HAZARD: host-sync
        return y.tanh()


class FlagsClean(Flags):
    @torch.no_grad()
    def step(self):
        return self.lin(self.x).tanh()


def make(device):
    return Flags(device)


def make_clean(device):
    return FlagsClean(device)
