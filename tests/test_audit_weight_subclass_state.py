"""Python state kept inside a quantized weight: a tensor subclass held in a module's parameter table.

A weight-only quantized linear keeps its weight as a wrapper tensor subclass (torchao, bitsandbytes style)
whose `__torch_dispatch__` dequantizes on every use. The weight holds Python state of its own: a QuantState
dataclass, flags, counters. A dispatch that changes it (`w.state.calls += 1`, `w.uses += 1`) changes it once
under capture and never in a replay. The state snapshot did not walk a module's parameters or buffers, so the
weight's attributes were never compared and the change went unreported. The finding is at the dispatch's line,
with the target's call of the module as caller; a dispatch that writes the same value every step is clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, marked_line, module_target, write_target

LIB = """
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class {state_cls}:
    scale: torch.Tensor
    {counter}: int = 0
    rows: int = 0


class QWeight(torch.Tensor):
    @staticmethod
    def __new__(cls, q, state):
        return torch.Tensor._make_wrapper_subclass(cls, q.shape, dtype=state.scale.dtype, device=q.device)

    def __init__(self, q, state):
        self.q, self.state, self.{own} = q, state, 0

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.detach.default:
            return QWeight(args[0].q, args[0].state)
        x, w = args
        {body}
        return x @ (w.q.to(x.dtype) * w.state.scale[:, None])


class QLinear(nn.Module):
    def __init__(self, d):
        super().__init__()
        w = torch.randn(d, d)
        scale = w.abs().amax(1) / 127
        q = torch.round(w / scale[:, None]).to(torch.int8)
        weight = QWeight(q, {state_cls}(scale))
        {store}

    def forward(self, x):
        return torch.mm(x, self.weight)
"""

BODIES = {"held": "w.state.{counter} += 1  # LIBSITE", "own": "w.{own} += 1  # LIBSITE",
          "clean": "w.state.rows = x.shape[0]  # LIBSITE"}
STORES = {"parameter": "self.weight = nn.Parameter(weight, requires_grad=False)",
          "buffer": "self.register_buffer('weight', weight)"}


@pytest.mark.parametrize("store", ["parameter", "buffer"])
@pytest.mark.parametrize("kind", ["held", "own", "clean"])
def test_state_kept_on_a_weight_subclass(tmp_path, monkeypatch, kind, store):
    names = dict(state_cls=random.choice(["QuantState", "PackState"]), counter=random.choice(["calls", "uses_seen"]),
                 own=random.choice(["n_mm", "hits"]))
    src = LIB.format(body=BODIES[kind].format(**names), store=STORES[store], **names)
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="qw")
    tpl = module_target(imports=f"from {mod} import QLinear", init="        self.lin = QLinear({d})",
                        step="        self.out.copy_(self.lin(self.x))  # SITE\n        return self.out")
    path, site = write_target(tmp_path / "target" / "qweight.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    hit = clean_or_hit(bad, "clean" if kind == "clean" else "hit", "cpu-side-effect", lib, path, site)
    if hit is not None:
        assert marked_line(lib, "# LIBSITE") == int(hit.iloc[0].line)
