"""host-sync at a read of a position tensor built on the host and sent to the device in one expression.

Reference generate loops pass `torch.LongTensor([cur_pos]).to(tokens)` and the attention reads
`positions[-1].item()`. On a CPU scan `.to(D)` hands back the same storage, but no name holds the tensor before
the move, so on a GPU the read is of the device copy and waits for the device. When the step keeps the host
tensor under a name and reads that one (`pos.item()` beside `pos.to(D)`), the read is of host memory: no host-sync.
"""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

TEMPLATE = """
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear({d}, {d})
        self.register_buffer("cache", torch.zeros({cap}, {d}))

    def forward(self, x, positions, host_pos=None):
        self.cache.index_copy_(0, positions, self.proj(x))
        src = positions if host_pos is None else host_pos
        cur = src[-1].item() + 1  # SITE
        return torch.softmax(x @ self.cache[:cur].T, -1) @ self.cache[:cur]


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.attn = Attn()
        self.x = torch.zeros(1, {d})

    def prepare(self, i):
        self.pos = {prompt} + i
        self.x.copy_(torch.randn(1, {d}))

    @torch.no_grad()
    def step(self):
{call}


def make(device):
    return Target()
"""

SENT = "        return self.attn(self.x, torch.LongTensor([self.pos]).to(self.x.device))"
KEPT = """        pos = torch.tensor([self.pos])
        return self.attn(self.x, pos.to(self.x.device), pos)"""


def _fields(call):
    return dict(seed=random.randrange(10**6), d=random.choice([8, 16]), cap=64, prompt=random.choice([3, 7]),
                call=call)


def test_a_read_of_a_temporary_sent_to_the_device_waits(tmp_path):
    path, site = write_target(tmp_path / "sent_temporary.py", TEMPLATE, **_fields(SENT))
    bad = blocking(path)
    assert ((bad.line == site) & (bad.category == "host-sync")).any(), table(bad)


def test_a_read_of_the_kept_host_tensor_does_not(tmp_path):
    path, site = write_target(tmp_path / "sent_kept.py", TEMPLATE, **_fields(KEPT))
    bad = blocking(path)
    assert not ((bad.line == site) & (bad.category == "host-sync")).any(), table(bad)
