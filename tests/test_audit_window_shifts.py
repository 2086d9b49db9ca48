"""cpu-side-effect: a full window appended with a tensor made on the same line is still Python state.

Atari-style frame stacking keeps the last k frames in a `deque(maxlen=k)` and appends the step's own copy of
the observation (`self.frames.append(self.obs.clone())`), then stacks the window. The new frame escapes into
state (step-allocation, at that line), and the deque's older frames move one position, which a replay never
does: the graph keeps stacking the frames the capture saw. The second finding must survive although the
line is the allocation's. A dict slot rebound on its allocating line to a tensor a later step reads moves no
other member: step-allocation alone. Sizes, the window length and the spelling are drawn fresh."""

from __future__ import annotations

import random
import textwrap

from site_util import blocking, marked_line, table

TARGET = """
from collections import deque

import torch


class Target:
    def __init__(self, device):
        self.obs = torch.zeros({d}, device=device)
        self.frames = deque([torch.zeros({d}, device=device) for _ in range({k})], maxlen={k})
        self.slots = {{"h": torch.zeros({d}, device=device)}}
        self.w = torch.randn({d}, {d}, generator=torch.Generator().manual_seed({seed})).to(device)
        self.gen = torch.Generator().manual_seed({seed})

    def prepare(self, i):
        self.obs.copy_(torch.randn({d}, generator=self.gen))

    @torch.no_grad()
    def step(self):
{body}
        return x @ self.w


def make(device):
    return Target(device)
"""

WINDOW = ["self.frames.append({alloc})  # SITE"]
ALLOCS = ["self.obs.clone()", "self.obs * 1.0", "torch.tanh(self.obs)", "self.obs.to(torch.float64).float()"]
READS = ["x = torch.stack(list(self.frames)).sum(0)", "x = torch.cat(list(self.frames)).view({k}, {d}).mean(0)"]


def _write(tmp_path, kind: str):
    d, k, seed = random.choice([4, 6, 8]), random.choice([2, 3, 4]), random.randrange(2**31)
    alloc = random.choice(ALLOCS)
    if kind == "window":
        body = WINDOW[0].format(alloc=alloc) + "\n" + random.choice(READS).format(k=k, d=d)
    else:
        body = (f'self.slots["h"] = {alloc}  # SITE\n'
                'x = self.slots["h"] + self.obs')
    src = TARGET.format(d=d, k=k, seed=seed, body=textwrap.indent(body, " " * 8))
    if kind == "slot":  # the slot's tensor is read by the next step before it is rebound
        src = src.replace("    def step(self):\n", '    def step(self):\n        prev = self.slots["h"] * 2.0\n')
        src = src.replace("return x @ self.w", "return (x + prev) @ self.w")
    path = tmp_path / f"{kind}_{seed % 1000}.py"
    path.write_text(src)
    return path, marked_line(path, "# SITE")


def test_a_full_window_appended_with_a_fresh_tensor_is_a_side_effect_too(tmp_path):
    path, line = _write(tmp_path, "window")
    bad = blocking(path)
    cats = set(bad[bad.line == line].category)
    assert {"step-allocation", "cpu-side-effect"} <= cats, table(bad)


def test_a_slot_rebound_on_its_allocating_line_is_step_allocation_only(tmp_path):
    path, line = _write(tmp_path, "slot")
    bad = blocking(path)
    assert "step-allocation" in set(bad[bad.line == line].category), table(bad)
    assert "cpu-side-effect" not in set(bad.category), table(bad)
