"""rng: a generator registered with the graph under one name and drawn from under another is the same generator.

A diffusion runner seeds `self.gen` and hands it to its scheduler, which keeps it as `self.noise_gen` (or
`self.generator`) and draws the ancestral noise with `generator=self.noise_gen`; the runner's `capture()`,
which a scan never calls, registers `self.gen` with its graph. The names differ, so the match by last name
missed it and the draw was reported as blocking. Both expressions are followed on the traced objects to the
generator object itself. Registering another generator object, or none, leaves the draw blocking. Attribute
names, sizes and seeds are drawn fresh.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import torch


class Scheduler:
    def __init__(self, gen, d):
        self.{kept} = gen
        self.scale = torch.linspace(1.0, 0.1, d)

    def step(self, x):
        noise = torch.randn(x.shape, generator=self.{kept})  # SITE
        return x * self.scale + 0.1 * noise


class Runner:
    def __init__(self):
        self.{held} = torch.Generator().manual_seed({seed})
        self.spare = torch.Generator().manual_seed({seed} + 1)
        self.sched = Scheduler(self.{held}, {d})
        self.x = torch.zeros(1, {d})
        self.graph = None

    def capture(self):
        self.graph = torch.cuda.CUDAGraph()
        {register}
        with torch.cuda.graph(self.graph):
            self.step()

    def prepare(self, i):
        pass

    def step(self):
        self.x.copy_(self.sched.step(self.x))
        return self.x


def make(device):
    return Runner()
"""


@pytest.mark.parametrize("register", ["same", "other", "none"])
def test_a_generator_registered_under_another_name_does_not_block(tmp_path, register):
    held = random.choice(["gen", "rng", "seed_gen"])
    kept = random.choice(["noise_gen", "generator", "_gen"])
    reg = {"same": f"self.graph.register_generator_state(self.{held})",
           "other": "self.graph.register_generator_state(self.spare)", "none": "pass"}[register]
    path, site = write_target(tmp_path / "renamed_gen.py", TARGET, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), held=held, kept=kept, register=reg)
    bad = blocking(path)
    assert len(at(bad, "rng", site)) == (0 if register == "same" else 1), table(bad)
