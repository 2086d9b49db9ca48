"""data-dependent-control: a loop over keys that picks a module per key, with tests of the key against fixed things.

peft's LoRA layer loops `for name in self.active_adapters:`, skips names it has no weights for (`if name not in
lora_keys: continue`, `lora_keys = self.lora_A.keys()`), picks `a = self.lora_A[name]` and branches on `if name not
in self.lora_variant:`. When prepare() switches the active adapter, both steps run the same lines on another
module. Those `if`s answer the same for the same key in every step; the keys the loop visited decided, so the
loop is named, not the innermost `if` (which both steps entered). Likewise a mixed batch's loop over the adapters
present (`for name in sorted(set(names)):`) with a sentinel skip (`if name == "__base__": continue`): one step
lacking an adapter runs one trip fewer, and the loop is named, not the sentinel guard. A guard that reads state
the step changes (`if not self.on[name]: continue`) still decides.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, marked_line, table, write_target

ACTIVE = """
import torch
from torch import nn

NAMES = ["fr", "de", "it"]
D, R = {d}, {r}


class Adapted(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Linear(D, D)
        self.A = nn.ModuleDict({{n: nn.Linear(D, R, bias=False) for n in NAMES}})
        self.B = nn.ModuleDict({{n: nn.Linear(R, D, bias=False) for n in NAMES}})
        self.scale = {{n: 0.5 for n in NAMES}}
        self.variants = {{}}
        self.active = [NAMES[0]]

    def forward(self, x):
        out = self.base(x)
        keys = self.A.keys()
        for name in self.active:  # LOOP
            if name not in keys:  # GUARD
                continue
            a = self.A[name]
            b = self.B[name]
            if name not in self.variants:
                out = out + b(a(x)) * self.scale[name]
            else:
                out = self.variants[name](out, x)
        return out


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.m = Adapted().eval()
        self.x = torch.zeros(2, D)
        self.out = torch.zeros(2, D)
        self.schedule = {schedule}

    def prepare(self, i):
        self.x.copy_(torch.randn(2, D))
        self.m.active = [self.schedule[i % len(self.schedule)]]

    @torch.no_grad()
    def step(self):
        self.out.copy_(self.m(self.x))


def make(device):
    return Target()
"""

MIXED = """
import torch
from torch import nn

NAMES = ["fr", "de"]
D, R = {d}, {r}


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Linear(D, D)
        self.A = nn.ModuleDict({{n: nn.Linear(D, R, bias=False) for n in NAMES}})
        self.B = nn.ModuleDict({{n: nn.Linear(R, D, bias=False) for n in NAMES}})
        self.on = {{n: True for n in NAMES}}

    def forward(self, x, names):
        out = self.base(x)
        for name in sorted(set(names)):  # LOOP
            {guard}  # GUARD
                continue
            out = out + self.B[name](self.A[name](x))
        return out


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.m = Mixed().eval()
        self.x = torch.zeros(3, D)
        self.out = torch.zeros(3, D)
        self.routes = {routes}
        self.names = self.routes[0]

    def prepare(self, i):
        self.x.copy_(torch.randn(3, D))
        self.names = self.routes[i % len(self.routes)]
        self.m.on = {{"fr": True, "de": i % 2 == 0}}

    @torch.no_grad()
    def step(self):
        self.out.copy_(self.m(self.x, self.names))


def make(device):
    return Target()
"""

SCHEDULES = [["fr", "de"], ["de", "it", "fr"], ["it", "it", "fr", "de"]]
ROUTES = [[["fr", "__base__", "fr"], ["fr", "de", "de"], ["__base__", "de", "de"], ["fr", "de", "__base__"]],
          [["de", "__base__", "de"], ["fr", "fr", "de"], ["de", "de", "de"], ["__base__", "fr", "de"]]]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_switched_adapter_names_the_loop_over_the_active_names(tmp_path, schedule):
    path, loop = write_target(tmp_path / "active_adapter.py", ACTIVE, marker="# LOOP", schedule=repr(schedule),
                              d=random.choice([8, 16]), r=random.choice([2, 4]), seed=random.randrange(2**31))
    bad = blocking(path)
    control = bad[bad.category == "data-dependent-control"]
    assert set(control.line) == {loop}, table(bad)


@pytest.mark.parametrize("routes", ROUTES)
@pytest.mark.parametrize("guard", ["sentinel", "table", "both"])
def test_a_fixed_skip_of_the_mixed_batch_keys_names_the_loop(tmp_path, routes, guard):
    test = {"sentinel": 'if name == "__base__":', "table": "if name not in self.A.keys():",
            "both": 'if name in ("__base__", "none") or name not in self.A:'}[guard]
    path, loop = write_target(tmp_path / "mixed_batch.py", MIXED, marker="# LOOP", guard=test, routes=repr(routes),
                              d=random.choice([8, 16]), r=random.choice([2, 4]), seed=random.randrange(2**31))
    bad = blocking(path)
    control = bad[bad.category == "data-dependent-control"]
    assert set(control.line) == {loop}, table(bad)


def test_a_guard_on_state_the_step_changes_still_decides(tmp_path):
    path, _ = write_target(tmp_path / "mixed_on.py", MIXED, marker="# LOOP",
                           guard='if name == "__base__" or not self.on[name]:', routes=repr([["fr", "de", "fr"]]),
                           d=random.choice([8, 16]), r=random.choice([2, 4]), seed=random.randrange(2**31))
    bad = blocking(path)
    control = bad[bad.category == "data-dependent-control"]
    assert set(control.line) == {marked_line(path, "# GUARD")}, table(bad)


LRU = """
from collections import OrderedDict

import torch

D, SLOTS = {d}, {slots}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.table = torch.randn(64, D)
        self.cache = torch.zeros(SLOTS, D)
        self.lru = OrderedDict()
        self.ids = torch.zeros(4, dtype=torch.long)
        self.out = torch.zeros(4, D)
        self.fresh = {fresh}

    def prepare(self, i):
        hot = {hot}
        self.ids.copy_(torch.tensor([hot, self.fresh[i], hot, self.fresh[i] + 1 if i % 2 else hot]))

    @torch.no_grad()
    def step(self):
        slots = []
        for k in self.ids.tolist():
            if k in self.lru:  # GUARD
                self.lru.{touch}(k)
            else:
                slot = len(self.lru) % SLOTS
                self.cache[slot].copy_(self.table[k] * 2.0)
                self.lru[k] = slot
            slots.append(self.lru[k])
        self.out.copy_(self.cache[slots])


def make(device):
    return Target()
"""


@pytest.mark.parametrize("touch", ["move_to_end", "pop"])
def test_a_key_test_against_a_table_the_loop_changes_decides(tmp_path, touch):
    """An LRU cache's `if k in self.lru:` whose loop also inserts into (and refreshes) `self.lru`: the answer for a
    key depends on the earlier steps, so the `if` decided, not the loop over the ids."""
    fresh = random.sample(range(10, 60, 2), 8)
    path, guard = write_target(tmp_path / "lru_guard.py", LRU, marker="# GUARD", d=random.choice([4, 8]),
                               slots=random.choice([16, 32]), seed=random.randrange(2**31), fresh=repr(fresh),
                               hot=random.randrange(0, 10), touch=touch)
    if touch == "pop":  # a refresh that takes the key out and puts it back
        text = path.read_text().replace("self.lru.pop(k)", "self.lru[k] = self.lru.pop(k)")
        path.write_text(text)
    bad = blocking(path)
    control = bad[bad.category == "data-dependent-control"]
    assert set(control.line) == {guard}, table(bad)
