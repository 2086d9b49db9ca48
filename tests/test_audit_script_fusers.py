"""The scan runs TorchScript op by op: its fusers are off while the target's steps run, and back after.

On a GPU a fused group of a scripted function runs as one kernel below the tracer (tests/planted/script_fused.py
checks the consequence there); here, the switch itself, read by the target inside its step.
"""

from __future__ import annotations

import json
import random

import torch

import audit

TARGET = """
import json
import torch


class Target:
    def __init__(self):
        self.x = torch.zeros({n})

    def prepare(self, i):
        self.x.copy_(torch.randn({n}))

    def step(self):
        with open({log!r}, "a") as f:
            f.write(json.dumps([torch._C._jit_texpr_fuser_enabled(), torch._C._jit_can_fuse_on_gpu()]) + "\\n")
        return self.x * 2


def make(device):
    return Target()
"""


def test_fusers_off_in_the_step_and_restored(tmp_path):
    path = tmp_path / "fusers_target.py"
    log = tmp_path / "fusers.jsonl"
    path.write_text(TARGET.format(n=random.randint(2, 9), log=str(log)))
    before = (torch._C._jit_texpr_fuser_enabled(), torch._C._jit_can_fuse_on_gpu())
    inv = audit.scan(f"{path}:make", device="cpu", steps=2, warmup=1)
    seen = [tuple(json.loads(line)) for line in log.read_text().splitlines()]
    assert len(seen) == 3 and set(seen) == {(False, False)}, seen
    assert (torch._C._jit_texpr_fuser_enabled(), torch._C._jit_can_fuse_on_gpu()) == before
    assert inv.blocking().empty
