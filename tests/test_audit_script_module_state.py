"""State a TorchScript module keeps and its scripted forward changes (`self.calls += 1`).

`torch.jit.script(module)` keeps the module's plain attributes in its C++ object: no __dict__ entry, no Python
frame when the scripted forward changes one. A replay never runs that host work, as it would not for the same
statement in an eager module: a cpu-side-effect at the statement in the class the module was scripted from, with
the target's call of the module as caller, whether the forward's ops were placed on its lines (`x * w`, an op of
the graph) or not (`x @ w` dispatches `aten.mm` under a graph node `aten::matmul`). A scripted module whose
attributes stay the same is no finding.
"""

from __future__ import annotations

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch
from torch import nn

class Counted(nn.Module):
    def __init__(self, d: int, how: str):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, d) * 0.1)
        self.how = how
        self.calls = 0
        self.last = 0.0

    def forward(self, x):
        if self.how == "matmul":
            self.calls += 1  # LIBSITE matmul
            return x @ self.w
        if self.how == "mul":
            self.last = self.last + 1.0  # LIBSITE mul
            return x * self.w[0]
        return x * self.w[0] + self.calls  # LIBSITE clean

def scripted(d: int, how: str):
    return torch.jit.script(Counted(d, how))
"""


@pytest.mark.parametrize("how", ["matmul", "mul", "clean"])
def test_an_attribute_a_scripted_forward_changes_is_a_cpu_side_effect(tmp_path, monkeypatch, how):
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB, "scripted", "scripted", "self.sm(self.x)",
                                          init=f'        self.sm = scripted(self.w.shape[0], "{how}")')
    clean_or_hit(blocking(path, forget=mod), how, "cpu-side-effect", lib, path, site, marker=f"# LIBSITE {how}")
