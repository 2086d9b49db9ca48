"""Planted host state hung where an attribute scan of the target does not look (and a graph-safe twin).

A counter in the closure of a logits processor kept in a list, one in a forward hook's closure, a
"static variable" on a module-level function, a Python attribute set on a cache tensor, a ContextVar,
a cache of lambdas that a miss extends (the lambdas share a qualname: their cells are no change), a
0-dim host tensor that prepare() anneals and the step uses as a kernel scalar, and a device value
copied into a small host mirror. A replay would redo none of it (and the mirror copy waits for the
device).
"""

import contextvars

import torch
from torch import nn

D, V = 16, 32
STEPS = contextvars.ContextVar("decode_steps", default=0)  # request-scoped, set by middleware


def make_penalty(device):
    counts = torch.zeros(V, device=device)
    seen = 0

    def proc(logits, tok):
        nonlocal seen
        counts.index_add_(0, tok, torch.ones(1, device=logits.device))
        seen += 1  # HAZARD: cpu-side-effect
        return torch.where(counts > 0, logits * 0.9, logits)

    return proc


def attach_counter(module):
    calls = 0

    def hook(mod, inp, out):
        nonlocal calls
        calls += 1  # HAZARD: cpu-side-effect

    module.register_forward_hook(hook)


def note_step():
    note_step.calls += 1  # HAZARD: cpu-side-effect


note_step.calls = 0


class Attached:
    def __init__(self, device):
        self.proj = nn.Linear(D, D).to(device)
        self.w = torch.randn(D, V, device=device)
        self.h = torch.zeros(D, device=device)
        self.cache = torch.zeros(8, D, device=device)
        self.cache.filled = 0
        self.temp = torch.tensor(1.0, device="cpu")
        self.tok_cpu = torch.zeros(1, dtype=torch.long, device="cpu")
        self.processors = [make_penalty(device)]
        self.specialized = {}
        self.n = 0
        attach_counter(self.proj)

    def _build(self, bucket):
        scale = 1.0 / (1 + bucket)
        return lambda x: x * scale

    def prepare(self, i):
        self.h.copy_(torch.randn(D))
        self.temp.fill_(float(torch.rand(())) + 0.5)

    @torch.no_grad()
    def step(self):
        x = self.proj(self.h)
        logits = (x @ self.w) / self.temp  # HAZARD: baked-host-value
        tok = logits.argmax(-1, keepdim=True)
        for proc in self.processors:
            logits = proc(logits, tok)
        self.cache[0].copy_(x)
        self.cache.filled += 1  # HAZARD: cpu-side-effect
        self.tok_cpu.copy_(tok)  # HAZARD: host-sync
        note_step()
        STEPS.set(STEPS.get() + 1)  # HAZARD: cpu-side-effect
        self.n += 1  # HAZARD: cpu-side-effect
        if self.n not in self.specialized:
            self.specialized[self.n] = self._build(self.n)  # HAZARD: cpu-side-effect
        return logits


class AttachedClean(Attached):
    """Counters and the temperature on the device, updated in place; the mirror is left to the caller."""

    def __init__(self, device):
        super().__init__(device)
        self.proj._forward_hooks.clear()
        self.temp_dev = torch.ones((), device=device)
        self.seen = torch.zeros((), dtype=torch.long, device=device)
        self.counts = torch.zeros(V, device=device)
        self.tok = torch.zeros(1, dtype=torch.long, device=device)

    def prepare(self, i):
        self.h.copy_(torch.randn(D))
        self.temp_dev.fill_(float(torch.rand(())) + 0.5)

    @torch.no_grad()
    def step(self):
        x = self.proj(self.h)
        logits = (x @ self.w) / self.temp_dev
        self.tok.copy_(logits.argmax(-1, keepdim=True))
        self.counts.index_add_(0, self.tok, torch.ones(1, device=logits.device))
        self.seen.add_(1)
        self.cache[0].copy_(x)
        return torch.where(self.counts > 0, logits * 0.9, logits)


def make(device):
    return Attached(device)


def make_clean(device):
    return AttachedClean(device)
