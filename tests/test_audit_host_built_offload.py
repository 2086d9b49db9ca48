"""A model built on the host and offloaded as it is: its own weights are the hooks' host copies.

accelerate's `attach_align_device_hook(model, execution_device=device, offload=True,
weights_map=model.state_dict())` over a model constructed with no `device=` and never moved keeps the
model's own parameter memory, in host memory on a GPU too, and a forward pre-hook moves each weight to the
execution device at every call: a copy from pageable memory, which capture refuses. On a CPU scan nothing in
the source sends the weights to the host; the factories that made them named no device, while the target's
class puts its other tensors on a device. The same model moved with `.to(device)` first, or built with
`device=device`, keeps device memory in its hooks: no finding.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, marked_line, table, write_target

LIB = """
import torch
from torch import nn


class Hook:
    def __init__(self, module, device, weights):
        self.device, self.weights = device, weights
        self.names = [n for n, _ in module.named_parameters(recurse=False)]
        for n in self.names:
            delattr(module, n)
            setattr(module, n, None)

    def pre(self, module, args):
        for n in self.names:
            setattr(module, n, nn.Parameter(self.weights[n].to(self.device), requires_grad=False))  # LIBSITE


def attach(model, device, weights):
    for name, m in model.named_modules():
        if next(m.parameters(recurse=False), None) is not None:
            pre = name + "." if name else ""
            sub = {{k[len(pre):]: v for k, v in weights.items() if k.startswith(pre) and "." not in k[len(pre):]}}
            m.register_forward_pre_hook(Hook(m, device, sub).pre)
"""

KINDS = {
    "host": "Enc()",
    "moved": "Enc().to(device)",
    "built_on_device": "Enc(device=device)",
}

TARGET = """
import torch
from torch import nn
from {mod} import attach


class Enc(nn.Module):
    def __init__(self, device=None):
        super().__init__()
        self.a = nn.Linear({d}, {d}, device=device)
        self.b = nn.Linear({d}, {d}, device=device)

    def forward(self, x):
        x = torch.tanh(self.a(x))  # SITE
        return self.b(x)


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.enc = {build}.eval()
        attach(self.enc, torch.device(device), self.enc.state_dict())
        self.x = torch.zeros({n}, {d}, device=device)
        self.y = torch.zeros({n}, {d}, device=device)

    def prepare(self, i):
        self.x.normal_()

    @torch.no_grad()
    def step(self):
        self.y.copy_(self.enc(self.x))
        return self.y


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_host_built_model_offloaded_as_it_is(tmp_path, monkeypatch, kind):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{{", "{").replace("}}", "}"), "hostbuilt")
    path, site = write_target(tmp_path / "target" / "hostbuilt_target.py", TARGET, mod=mod, build=KINDS[kind],
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]), n=random.choice([1, 2, 3]))
    bad = blocking(path, forget=mod)
    if kind != "host":
        assert not len(bad), table(bad)
        return
    hit = bad[(bad.category == "pageable-copy") & bad.file.str.endswith(lib.name)
              & (bad.line == marked_line(lib, "# LIBSITE"))]
    assert sorted(hit.caller_line.astype(int)) == [site, site + 1], table(bad)  # each layer's call: its own finding
    assert len(hit) == len(bad), table(bad)
