"""cpu-side-effect: a container slot each step rebinds to the tensor it made is no Python state a replay misses.

A tensordict-style module writes its output into a dict the target keeps (`self.data[key] = out`, through
`__setitem__`, from a tensor made a call away), and no later step reads it: a replay rewrites the tensor the
slot took at capture, as it would a top-level attribute rebound to its output. A window kept in a full
`deque(maxlen=k)` appended with the step's tensor keeps older tensors at shifted positions, which a replay
never shifts: still a cpu-side-effect at the append. The key names, sizes and spelling are drawn fresh."""

from __future__ import annotations

import random

from site_util import blocking, install_library, marked_line, module_target, table, write_target

LIB = """
from collections import deque

import torch
from torch import nn


class Dict:
    def __init__(self, data):
        self._data = dict(data)
        self.window = deque([torch.zeros(1) for _ in range({k})], maxlen={k})

    def __getitem__(self, k):
        return self._data[k]

    def __setitem__(self, k, v):
        self._data[k] = v


class Module(nn.Module):
    def __init__(self, d, key):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.key = key

    def forward(self, td, x):
        {body}
        return td
"""

BODIES = {"fresh": ["td[self.key] = torch.tanh(self.lin(x))", "out = self.lin(x)\n        td[self.key] = out * 2.0",
                    "td._data[self.key] = self.lin(x).relu()"],
          "deque": ["td.window.append(self.lin(x).sum())  # LIBSITE", "out = self.lin(x).mean()\n        td.window.append(out)  # LIBSITE"]}


def _scan(tmp_path, monkeypatch, kind: str):
    key = random.choice(["logits", "value", "action_out"])
    d = random.choice([4, 8])
    src = LIB.format(k=random.choice([2, 3]), body=random.choice(BODIES[kind]))
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="slots")
    tpl = module_target(imports=f"from {mod} import Dict, Module",
                        init=f"        self.td = Dict({{{{'{key}': torch.zeros(1, {d})}}}})\n        self.m = Module({d}, '{key}')",
                        step="        self.m(self.td, self.x)  # SITE\n        self.out.copy_(self.x * 1.5)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "slots.py", tpl, seed=random.randrange(2**31), d=d)
    return blocking(path, forget=mod), lib, site


def test_a_slot_rebound_to_the_steps_own_tensor_is_clean(tmp_path, monkeypatch):
    bad, _, _ = _scan(tmp_path, monkeypatch, "fresh")
    assert not len(bad), table(bad)


def test_a_window_shifting_older_tensors_is_a_cpu_side_effect(tmp_path, monkeypatch):
    bad, lib, site = _scan(tmp_path, monkeypatch, "deque")
    cse = bad[bad.category == "cpu-side-effect"]
    assert list(cse.line) == [marked_line(lib, "# LIBSITE")], table(bad)
    assert int(cse.iloc[0].caller_line) == site, table(cse)
