"""The toy decoder of toy_decoder.py, rewritten to be graph-ready.

- the KV cache is preallocated at its maximum length and written in place at a device position;
- attention runs over the whole cache with a validity mask, so every step has the same shapes;
- the position lives in a device tensor that the step advances itself (pos.add_(1));
- the input id is a static buffer that prepare() refills with copy_ (outside the graph);
- the end-of-sequence test stays on the device; the host reads it after the step, if at all.

Scan it with:
    dsv4-audit scan --target docs/examples/toy_decoder_static.py:make --device cpu --out /tmp/toy-static
"""

import torch
from torch import nn

D, VOCAB, EOS, MAX_LEN = 64, 256, 0, 64


class StaticToyDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.qkv = nn.Linear(D, 3 * D)
        self.head = nn.Linear(D, VOCAB)
        self.register_buffer("k_cache", torch.zeros(1, MAX_LEN, D))
        self.register_buffer("v_cache", torch.zeros(1, MAX_LEN, D))
        self.register_buffer("pos", torch.zeros(1, dtype=torch.long))
        self.register_buffer("slots", torch.arange(MAX_LEN))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)[:, None]  # [1, 1, D]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q * (1.0 + 0.01 * self.pos.float())  # the same scale, read from the device
        self.k_cache.index_copy_(1, self.pos, k)  # write in place at the device position
        self.v_cache.index_copy_(1, self.pos, v)
        scores = q @ self.k_cache.transpose(1, 2) / D**0.5  # [1, 1, MAX_LEN]: fixed shape
        scores = scores.masked_fill(self.slots > self.pos, float("-inf"))  # unwritten slots
        att = torch.softmax(scores, dim=-1)
        self.pos.add_(1)  # advanced on the device, so a replay advances it too
        return self.head(att @ self.v_cache)[:, 0]


class Target:
    def __init__(self, device):
        torch.manual_seed(0)
        self.device = device
        self.model = StaticToyDecoder().to(device)
        self.gen = torch.Generator().manual_seed(0)
        self.ids = torch.zeros(1, dtype=torch.long, device=device)  # static input buffer
        self.done = torch.zeros(1, dtype=torch.bool, device=device)  # static output flag

    def prepare(self, i):
        self.ids.copy_(torch.randint(1, VOCAB, (1,), generator=self.gen))  # same address every step

    @torch.no_grad()
    def step(self):
        logits = self.model(self.ids)
        self.done.copy_(logits.argmax(-1) == EOS)  # stays on the device
        return logits


def make(device):
    return Target(device)
