"""A host-made counter that another class of the hierarchy moves to the device.

A cache mixin makes its token count with a factory naming no device (`torch.tensor(0)` in `__init__`), and the
layer class built on it moves that count to the device of the first states it sees (`self.count =
self.count.to(self.device)` in its lazy set-up), as transformers' linear-attention cache layers do. On a GPU
the count lives on the device by the time the step runs, so advancing it in place is device work the graph
replays, not host bookkeeping. A CPU scan sees a host factory in one class and a no-op move in another: the
move decides. Without it, the same count stays in host memory and the update is a cpu-side-effect finding.
"""

from __future__ import annotations

import random

import pytest

from site_util import clean_or_hit, blocking, library_target

LIB = """
import torch


class CountMixin:
    def __init__(self):
        self.{count} = torch.tensor(0, dtype=torch.long)
        self.device = None

    def reset(self):
        self.{count}.zero_()
        self.state = torch.zeros_like(self.state, device=self.device)


class LazyState(CountMixin):
    def lazy_init(self, x):
        self.device = x.device
        {move}
        self.state = torch.zeros(x.shape, device=self.device)

    def update(self, x):
        if self.device is None:
            self.lazy_init(x)
        self.{count}.add_(x.shape[0])  # LIBSITE
        self.state.mul_({decay}).add_(x)
        return self.state
"""

MOVES = {"moved": "self.{count} = self.{count}.to(self.device)", "kept": "pass"}


@pytest.mark.parametrize("kind", ["moved", "kept"])
def test_count_moved_to_the_device_by_a_subclass(tmp_path, monkeypatch, kind):
    count = random.choice(["seen", "cumulative_length", "n_tokens"])
    src = LIB.format(count=count, move=MOVES[kind].format(count=count), decay=random.choice([0.5, 0.25, 0.9]))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "lazy", "LazyState", "self.cache.update(self.x @ self.w)",
                                          init="        self.cache = LazyState()")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "clean" if kind == "moved" else "hit", "cpu-side-effect", lib, path, site)
