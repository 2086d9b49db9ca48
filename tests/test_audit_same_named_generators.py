"""rng: a registered generator's name does not register another generator object of the same name.

A runner registers its sampling generator (`graph.register_generator_state(self.gen)`) in a `capture()` the
scan never runs; an exploration-noise helper it holds keeps a generator of its own, also called `gen`, and
draws with `generator=self.gen`. The last names match, the objects do not: the helper's draw still makes
capture raise (blocks-capture), while the runner's own draw is registered (info). When the helper is handed
the runner's generator itself, its draw is registered too. Names, sizes and the draw op are drawn fresh."""

from __future__ import annotations

import random

from site_util import blocking, marked_line, table

TARGET = """
import torch


class Noise:
    def __init__(self, device, gen=None):
        self.{g} = gen if gen is not None else torch.Generator(device=device).manual_seed({seed})

    def __call__(self, like):
        return {draw}  # SITE


class Runner:
    def __init__(self, device):
        self.w = torch.randn({d}, {d}, generator=torch.Generator().manual_seed({seed})).to(device)
        self.{g} = torch.Generator(device=device).manual_seed({seed} + 1)
        self.noise = Noise(device{handed})
        self.x = torch.zeros({d}, device=device)
        self.out = torch.zeros({d}, device=device)

    def capture(self):
        self.graph = torch.cuda.CUDAGraph()
        self.graph.register_generator_state(self.{g})
        with torch.cuda.graph(self.graph):
            self.step()

    def prepare(self, i):
        self.x.copy_(torch.randn({d}, generator=torch.Generator().manual_seed(i)))

    @torch.no_grad()
    def step(self):
        y = torch.rand({d}, generator=self.{g}, device=self.x.device) + self.x @ self.w  # OWN
        self.out.copy_(y + self.noise(y))
        return self.out


def make(device):
    return Runner(device)
"""

DRAWS = ["torch.randn(like.shape, generator=self.{g}, device=like.device) * 0.1",
         "torch.empty_like(like).normal_(0.0, 0.1, generator=self.{g})",
         "torch.rand(like.shape, generator=self.{g}, device=like.device) - 0.5"]


def _write(tmp_path, handed: bool):
    g = random.choice(["gen", "rng", "generator_"])
    seed, d = random.randrange(2**20), random.choice([4, 8, 16])
    src = TARGET.format(g=g, seed=seed, d=d, draw=random.choice(DRAWS).format(g=g),
                        handed=f", self.{g}" if handed else "")
    path = tmp_path / f"runner_{seed}.py"
    path.write_text(src)
    return path, marked_line(path, "# SITE")


def test_a_helper_generator_named_like_the_registered_one_is_not_registered(tmp_path):
    path, line = _write(tmp_path, handed=False)
    bad = blocking(path)
    rng = bad[bad.category == "rng"]
    assert list(rng.line) == [line], table(bad)


def test_the_registered_generator_handed_to_the_helper_stays_registered(tmp_path):
    path, _ = _write(tmp_path, handed=True)
    bad = blocking(path)
    assert not len(bad[bad.category == "rng"]), table(bad)
