"""Planted device-to-host copy behind a config field (and a twin whose field follows the target's device).

KV offload managers take their offload device from a dataclass config whose default is the CPU; the step
spills a block with `.to(self.cfg.spill_device)`. On a GPU that is a copy into pageable host memory: the
host waits for the device. The twin's config is built with the target's device, so its `.to(...)` stays
on the device, and its `device` field's "cpu" is a compute device's default (set elsewhere at run time).
"""

import dataclasses

import torch

D = 8


@dataclasses.dataclass
class SpillConfig:
    spill_device: str = "cpu"
    keep: int = 2


@dataclasses.dataclass
class StageConfig:
    stage_device: str = "cpu"


@dataclasses.dataclass
class RunConfig:  # the compute device: "cpu" is only the default a launcher elsewhere overrides
    device: str = "cpu"


class Spill:
    def __init__(self, device):
        self.cfg = SpillConfig()
        self.kv = torch.zeros(4, D, device=device)
        self.x = torch.zeros(4, D, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(4, D))

    @torch.no_grad()
    def step(self):
        self.kv.mul_(0.5).add_(self.x)
        spilled = self.kv[: self.cfg.keep].to(self.cfg.spill_device)  # HAZARD: host-sync
        return spilled


class SpillClean(Spill):
    def __init__(self, device):
        super().__init__(device)
        self.stage = StageConfig(stage_device=device)

        self.run = RunConfig()

    @torch.no_grad()
    def step(self):
        self.kv.mul_(0.5).add_(self.x)
        return self.kv[:2].to(self.stage.stage_device) + self.kv[2:].to(self.run.device)


def make(device):
    return Spill(device)


def make_clean(device):
    return SpillClean(device)
