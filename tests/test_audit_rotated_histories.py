"""cpu-side-effect: a history list the host rotates each step (a multistep solver's `model_outputs`) is Python
state, beside the escape of the tensor the step adds to it.

A DPM-Solver-style scheduler keeps its last converted model outputs in a list: `outs[i] = outs[i + 1]` shifts
them, `outs[-1] = x0` stores the step's own tensor, and the next step reads it as the previous output. step-allocation reports
the escaping `x0` at the line that made it. The shift is a second hazard: a replay rebinds no slot, so the older
entry stays the tensor of the step before capture forever. It was missed because the container's new member
escaped, which made the whole change step-allocation's. The store of the step's own tensor through a negative
index (`outs[-1] = x0`) stays step-allocation's. Sizes, history lengths and spellings are drawn fresh.
"""

from __future__ import annotations

import random

from site_util import at, blocking, marked_line, table, write_target

TARGET = """
import torch


class Solver:
    def __init__(self, order, d):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn(d, d, generator=g) * 0.1
        self.outs = [torch.zeros(1, d) for _ in range(order)]
        self.order = order

    def step(self, x):
        x0 = torch.tanh(x @ self.w)  # ALLOC
        prev = self.outs[-1]
{store}
        return x0 + {coef} * (x0 - prev)


class Target:
    def __init__(self):
        self.solver = Solver({order}, {d})
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        self.out.copy_(self.solver.step(self.x))
        return self.out


def make(device):
    return Target()
"""

ROTATIONS = [
    "        for i in range(self.order - 1):\n            self.outs[i] = self.outs[i + 1]  # SHIFT\n        self.outs[-1] = x0  # STORE",
    "        self.outs[:-1] = self.outs[1:]  # SHIFT\n        self.outs[-1] = x0  # STORE",
    "        self.outs.pop(0)  # SHIFT\n        self.outs.append(x0)  # STORE",
]


def _scan(tmp_path, store: str):
    d, order = random.choice([4, 8, 16]), random.choice([2, 3])
    path, alloc = write_target(tmp_path / "rotated.py", TARGET, marker="# ALLOC", seed=random.randrange(2**31),
                               d=d, order=order, store=store, coef=random.choice([0.5, 0.25, 1.5]))
    return blocking(path), path, alloc


def test_a_rotated_history_is_a_cpu_side_effect_beside_the_escape(tmp_path):
    store = random.choice(ROTATIONS)
    bad, path, alloc = _scan(tmp_path, store)
    assert len(at(bad, "step-allocation", alloc)) == 1, table(bad)
    cse = bad[bad.category == "cpu-side-effect"]
    assert marked_line(path, "# SHIFT") in set(cse.line), table(bad)


def test_the_negative_index_store_of_the_steps_own_tensor_is_the_escapes(tmp_path):
    bad, path, alloc = _scan(tmp_path, ROTATIONS[0])
    assert len(at(bad, "step-allocation", alloc)) == 1, table(bad)
    cse = bad[bad.category == "cpu-side-effect"]
    assert list(cse.line) == [marked_line(path, "# SHIFT")], table(bad)


def test_a_slot_rebound_without_a_shift_stays_the_escapes(tmp_path):
    store = random.choice(["        self.outs[-1] = x0  # STORE", "        self.outs[self.order - 1] = x0  # STORE"])
    bad, path, alloc = _scan(tmp_path, store)
    assert len(at(bad, "step-allocation", alloc)) == 1, table(bad)
    assert not len(bad[bad.category == "cpu-side-effect"]), table(bad)
