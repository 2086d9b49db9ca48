"""A draw on an explicit generator that the target registers with the graph it captures is no capture failure.

A seeded per-request sampler passes `generator=self.gen` to torch.multinomial; the runner's `capture()`, which a
scan never calls, registers that generator with its graph (`graph.register_generator_state(self.sampler.gen)`),
so capture records the draw and each replay advances the generator. Registering another generator, or none,
leaves the draw blocking. The generator may reach the draw through a helper's `generator=` parameter.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, captured_sampler, table, write_target

TARGET = """
import torch

V, B = {v}, {b}


def draw(probs, out, generator=None):
    return torch.multinomial(probs, 1, generator=generator, out=out)  # {helper_mark}


class Sampler:
    def __init__(self):
        self.gen = torch.Generator().manual_seed({seed})
        self.other = torch.Generator().manual_seed({seed} + 1)


class Runner:
    def __init__(self):
        self.sampler = Sampler()
        self.logits = torch.zeros(B, V)
        self.tok = torch.zeros(B, 1, dtype=torch.long)
        self.graph = None

""" + captured_sampler("tok", "Runner")

DRAWS = {"direct": "torch.multinomial(probs, 1, generator=self.sampler.gen, out=self.tok)  # SITE",
         "helper": "draw(probs, self.tok, generator=self.sampler.gen)"}
REGISTERS = {"same": "self.graph.register_generator_state(self.sampler.gen)",
             "other": "self.graph.register_generator_state(self.sampler.other)", "none": "pass"}


@pytest.mark.parametrize("via", ["direct", "helper"])
@pytest.mark.parametrize("register", ["same", "other", "none"])
def test_a_registered_generator_draw_does_not_block(tmp_path, via, register):
    path, site = write_target(tmp_path / "seeded_runner.py", TARGET, seed=random.randrange(2**31),
                              v=random.choice([16, 32, 48]), b=random.choice([1, 2, 3]), draw=DRAWS[via],
                              register=REGISTERS[register], helper_mark="SITE" if via == "helper" else "HELPER")
    bad = blocking(path)
    hits = at(bad, "rng", site)
    assert len(hits) == (0 if register == "same" else 1), table(bad)
