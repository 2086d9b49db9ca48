"""Planted module choice by a host key (and a graph-safe twin): the step looks its module up by a
name or key that the scheduler changes between steps: `getattr(self, f"head_{self.task}")`, a dict
`.get(self.lang)`, `getattr(self.experts, self.kind)`. A graph keeps the module captured; the
decision is the line that looked it up, not the call on the next line.
"""

import torch
from torch import nn

D = 8
TASKS, LANGS, KINDS = ("chat", "code"), ("en", "de"), ("up", "down")


class Named:
    def __init__(self, device):
        self.head_chat = nn.Linear(D, D).to(device)
        self.head_code = nn.Linear(D, D).to(device)
        self.adapters = {lang: nn.Linear(D, D).to(device) for lang in LANGS}
        self.experts = nn.ModuleDict({k: nn.Linear(D, D) for k in KINDS}).to(device)
        self.task, self.lang, self.kind = TASKS[0], LANGS[0], KINDS[0]
        self.x = torch.zeros(D, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(D))
        self.task, self.lang, self.kind = TASKS[i % 2], LANGS[i // 2 % 2], KINDS[i // 3 % 2]

    @torch.no_grad()
    def step(self):
        head = getattr(self, f"head_{self.task}")  # HAZARD: data-dependent-control
        h = torch.tanh(head(self.x))
        adapter = self.adapters.get(self.lang)  # HAZARD: data-dependent-control
        h = torch.tanh(adapter(h))
        expert = getattr(self.experts, self.kind)  # HAZARD: data-dependent-control
        return torch.tanh(expert(h))


def _stacked(mods) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights and biases of same-shaped linear layers, stacked once so the step gathers on the device."""
    return torch.stack([m.weight.detach() for m in mods]), torch.stack([m.bias.detach() for m in mods])


class NamedClean(Named):
    """The keys live in device tensors; each choice is an index_select into stacked weights."""

    def __init__(self, device):
        super().__init__(device)
        self.tables = [_stacked([self.head_chat, self.head_code]), _stacked([self.adapters[k] for k in LANGS]),
                       _stacked([self.experts[k] for k in KINDS])]
        self.keys = torch.zeros(3, dtype=torch.long, device=device)

    def prepare(self, i):
        super().prepare(i)
        self.keys.copy_(torch.tensor([TASKS.index(self.task), LANGS.index(self.lang), KINDS.index(self.kind)]))

    @torch.no_grad()
    def step(self):
        h = self.x
        for j, (w, b) in enumerate(self.tables):
            k = self.keys[j : j + 1]
            h = torch.tanh(w.index_select(0, k)[0] @ h + b.index_select(0, k)[0])
        return h


def make(device):
    return Named(device)


def make_clean(device):
    return NamedClean(device)
