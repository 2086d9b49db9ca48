"""Per-request generators kept in a container: a draw on one of them is captured when the target registers them.

A seeded sampler keeps one torch.Generator per batch slot (`self.gens`, a list or a dict) and draws row `b` with
`generator=self.gens[b]`, or with a loop variable over them; the runner's `capture()`, which a scan never calls,
registers every one in a loop (`for gen in self.gens: graph.register_generator_state(gen)`). The draw and the
registration name no attribute in common but the container, so they are matched by it. Registering nothing, or
a helper's own list of generators under the same name, leaves the draw blocking.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, captured_sampler, table, write_target

TARGET = """
import torch

B, V = {b}, {v}


class Noise:
    def __init__(self):
        self.gens = [torch.Generator().manual_seed({seed} + 100 + k) for k in range(B)]


class Sampler:
    def __init__(self):
        self.gens = {container}
        self.noise = Noise()
        self.logits = torch.zeros(B, V)
        self.out = torch.zeros(B, dtype=torch.long)
        self.graph = None

""" + captured_sampler("out", "Sampler")

CONTAINERS = {"list": "[torch.Generator().manual_seed({seed} + k) for k in range(B)]",
              "dict": "{{k: torch.Generator().manual_seed({seed} + k) for k in range(B)}}"}
DRAWS = {
    "subscript": ("for b in range(B):\n"
                  "            q = torch.empty_like(probs[b]).exponential_(generator=self.gens[b])  # SITE\n"
                  "            self.out[b] = (probs[b] / q).argmax()"),
    "loop": ("for b, gen in enumerate(self.gens{values}):\n"
             "            q = torch.empty_like(probs[b]).exponential_(generator=gen)  # SITE\n"
             "            self.out[b] = (probs[b] / q).argmax()"),
}
REGISTERS = {
    "loop": "for gen in self.gens{values}:\n            self.graph.register_generator_state(gen)",
    "comprehension": "[self.graph.register_generator_state(g) for g in self.gens{values}]",
    "helper": "for gen in self.noise.gens:\n            self.graph.register_generator_state(gen)",
    "none": "pass",
}


@pytest.mark.parametrize("container", ["list", "dict"])
@pytest.mark.parametrize("draw", ["subscript", "loop"])
@pytest.mark.parametrize("register", ["loop", "comprehension", "helper", "none"])
def test_registered_container_generators_do_not_block(tmp_path, container, draw, register):
    seed = random.randrange(2**20)
    values = ".values()" if container == "dict" else ""
    path, site = write_target(
        tmp_path / "per_request.py", TARGET, b=random.choice([2, 3, 4]), v=random.choice([16, 32, 64]), seed=seed,
        container=CONTAINERS[container].format(seed=seed), draw=DRAWS[draw].format(values=values),
        register=REGISTERS[register].format(values=values))
    bad = blocking(path)
    assert len(at(bad, "rng", site)) == (0 if register in ("loop", "comprehension") else 1), table(bad)
