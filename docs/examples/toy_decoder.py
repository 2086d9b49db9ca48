"""A toy one-layer decoder with a KV cache, written the way eager decode loops usually are.

Scan it with:
    dsv4-audit scan --target docs/examples/toy_decoder.py:make --device cpu --out /tmp/toy-eager
The scan reports eight blocking or silent hazards here (docs/targets.md lists them);
docs/examples/toy_decoder_static.py is the same model rewritten to be graph-ready.
"""

import torch
from torch import nn

D, VOCAB, EOS = 64, 256, 0


class ToyDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.qkv = nn.Linear(D, 3 * D)
        self.head = nn.Linear(D, VOCAB)
        self.k_cache = torch.zeros(1, 0, D)  # grows by one row per token
        self.v_cache = torch.zeros(1, 0, D)
        self.pos = 0  # Python position counter

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)[:, None]  # [1, 1, D]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q * (1.0 + 0.01 * self.pos)  # a position-dependent scale, from a Python int
        self.k_cache = torch.cat([self.k_cache, k], dim=1)  # new, larger tensor every step
        self.v_cache = torch.cat([self.v_cache, v], dim=1)
        att = torch.softmax(q @ self.k_cache.transpose(1, 2) / D**0.5, dim=-1)
        self.pos += 1
        return self.head(att @ self.v_cache)[:, 0]  # [1, VOCAB]


class Target:
    def __init__(self, device):
        torch.manual_seed(0)
        self.device = device
        self.model = ToyDecoder().to(device)
        self.model.k_cache = self.model.k_cache.to(device)
        self.model.v_cache = self.model.v_cache.to(device)
        self.gen = torch.Generator().manual_seed(0)
        self.done = False

    def prepare(self, i):
        # a fresh tensor every step: the step reads its input from a new address each time
        self.ids = torch.randint(1, VOCAB, (1,), generator=self.gen).to(self.device)

    @torch.no_grad()
    def step(self):
        logits = self.model(self.ids)
        if logits.argmax(-1).item() == EOS:  # the host reads a device value
            self.done = True
        return logits


def make(device):
    return Target(device)
