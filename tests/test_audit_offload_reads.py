"""What a layer computes from an offloaded weight after its hook moved it to the device is device memory.

An accelerate-style offload hook keeps a layer's weights on the host and moves each one to the execution
device in a forward pre-hook (`.to(device)`, then re-wrapped in a Parameter): that move is the pageable copy.
On a CPU scan the move returns the host storage itself, so the layer's output, and the step's copy of it into
a static device buffer, read as "computed from the host tensor" unless a read after the move counts as a read
of the device copy. The move is still reported, once, at the hook's line.
"""

from __future__ import annotations

import random

from site_util import at, blocking, install_library, marked_line, table, write_target

LIB = """
import torch
from torch import nn


class Offload:
    def __init__(self, module, device):
        self.device = torch.device(device)
        self.host = {n: p.detach().to("cpu") for n, p in module.named_parameters(recurse=False)}
        for n in self.host:
            delattr(module, n)
            setattr(module, n, None)

    def pre(self, module, args):
        for n, w in self.host.items():
            setattr(module, n, nn.Parameter(w.to(self.device), requires_grad=False))  # LIBSITE
        return None


def offload(model, device):
    for m in model.modules():
        if next(m.parameters(recurse=False), None) is not None:
            m.register_forward_pre_hook(Offload(m, device).pre)
"""

TARGET = """
import torch
from torch import nn
from {mod} import offload


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding({v}, {d})
        self.head = nn.Linear({d}, {v})

    def forward(self, ids):
        h = self.emb(ids)  # SITE
        return self.head(torch.relu(h))


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.net = Net().to(device).eval()
        offload(self.net, device)
        self.ids = torch.zeros({b}, dtype=torch.long, device=device)
        self.tok = torch.zeros({b}, dtype=torch.long, device=device)
        self.logp = torch.zeros({b}, {v}, device=device)

    def prepare(self, i):
        self.ids.copy_(torch.randint(0, {v}, ({b},)))

    @torch.no_grad()
    def step(self):
        logits = self.net(self.ids)
        self.tok.copy_(logits.argmax(-1))  # COPY
        self.logp.copy_(logits.log_softmax(-1))
        return self.tok


def make(device):
    return Target(device)
"""


def test_outputs_of_moved_weights_are_no_host_data(tmp_path, monkeypatch):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, "offread")
    path, site = write_target(tmp_path / "target" / "offread_target.py", TARGET, mod=mod,
                              seed=random.randrange(2**31), d=random.choice([8, 16, 32]),
                              v=random.choice([24, 40, 64]), b=random.choice([1, 2, 3]))
    bad = blocking(path, forget=mod)
    copies = bad[bad.category == "pageable-copy"]  # the moves themselves, at the hook, once per layer's call
    assert (copies.file.str.endswith(lib.name) & (copies.line == marked_line(lib, "# LIBSITE"))).all(), table(bad)
    assert sorted(copies.caller_line.astype(int)) == [site, site + 1], table(bad)
    copy = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if "# COPY" in t)
    assert not len(at(bad, "pageable-copy", copy)), table(bad)
