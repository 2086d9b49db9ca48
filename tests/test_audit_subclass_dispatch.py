"""A tensor subclass's Python `__torch_dispatch__` is traced like any other code of the step.

Torch calls a subclass's `__torch_dispatch__` below the dispatch mode (a quantized weight that dequantizes
on every use: torchao / bitsandbytes style), so the ops it runs on its inner tensors never reached the
tracer. A hazard there (per-block scales made from a Python list with `torch.tensor(..., device=)`, a
`torch.nonzero`) is found at the subclass's line, with the target's call of the module as caller. A
subclass that dequantizes with device ops only stays clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, module_target, table, write_target

LIB = """
import torch
from torch.utils._pytree import tree_map


class QWeight(torch.Tensor):
    @staticmethod
    def __new__(cls, q, scale):
        return torch.Tensor._make_wrapper_subclass(cls, q.shape, dtype=torch.float32, device=q.device)

    def __init__(self, q, scale):
        self.q, self.scale = q, scale
        self.blocks = [float(s) for s in scale.flatten()]

    def dequant(self):
        {line}
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        un = lambda a: a.dequant() if isinstance(a, QWeight) else a
        return func(*tree_map(un, args), **tree_map(un, kwargs or {{}}))


def quantize_(lin):
    w = lin.weight.detach()
    scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-8)
    del lin.weight
    lin.weight = QWeight(torch.round(w / scale).to(torch.int8), scale)
"""

BODIES = {
    "host_list": ("pageable-copy",
                  "out = self.q.float() * torch.tensor(self.blocks, device=self.q.device).view(-1, 1)  # LIBSITE"),
    "nonzero": ("host-sync", "out = self.q.float() * self.scale * torch.nonzero(self.q).shape[0]  # LIBSITE"),
    "clean": (None, "out = self.q.float() * self.scale  # LIBSITE"),
}

TARGET = module_target(imports="from {mod} import quantize_", init="""\
        self.lin = nn.Linear({d}, {d})
        quantize_(self.lin)""", step="""\
        h = self.lin(self.x)  # SITE
        self.out.copy_(h)
        return self.out""")


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_subclass_dispatch_body_is_traced(tmp_path, monkeypatch, kind):
    category, line = BODIES[kind]
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{line}", line).replace("{{}}", "{}"), prefix="qlib")
    path, site = write_target(tmp_path / "target" / "q_target.py", TARGET, mod=mod,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    if category is None:
        assert not len(bad), table(bad)
        return
    library_hit(bad, category, lib, path, site)
