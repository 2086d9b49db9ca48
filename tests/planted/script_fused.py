"""A scripted elementwise helper in the step, next to one planted host read (and a twin without it).

On a GPU, TorchScript's profiling executor fuses a scripted chain of pointwise ops into one kernel after a
couple of calls; that kernel would run below the tracer, and its output would look like a tensor from outside
the step. The scan runs scripts op by op, so the helper adds nothing: only the planted read is a finding.
"""

import torch

D = 16


@torch.jit.script
def gated(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * 2.0 + 1.0) * torch.sigmoid(m).unsqueeze(-1) - 0.5 * x


class Scripted:
    def __init__(self, device):
        self.w = torch.randn(D, D, device=device) * 0.1
        self.x = torch.zeros(4, D, device=device)
        self.m = torch.zeros(4, device=device)
        self.out = torch.zeros(4, D, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(4, D))
        self.m.copy_(torch.randn(4))

    @torch.no_grad()
    def step(self):
        h = self.x @ self.w
        s = gated(h, self.m)
        self.out.copy_(h + s * float(self.m.abs().max()))  # HAZARD: host-sync, baked-host-value
        return self.out


class ScriptedClean(Scripted):
    @torch.no_grad()
    def step(self):
        h = self.x @ self.w
        s = gated(h, self.m)
        self.out.copy_(h + s * self.m.abs().amax())
        return self.out


def make(device):
    return Scripted(device)


def make_clean(device):
    return ScriptedClean(device)
