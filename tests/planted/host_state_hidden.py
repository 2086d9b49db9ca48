"""Planted host state that a step advances where an attribute scan cannot see it (and a twin).

A generator or an iterator kept across steps (the object stays the same, its position moves), a
counter in the closure of a step function hung on the object, and a counter six objects deep in
scheduler bookkeeping. A replay would redo none of it.
"""

import torch


class Stats:
    def __init__(self):
        self.generated = 0


class Seq:
    def __init__(self):
        self.stats = Stats()


class Request:
    def __init__(self):
        self.seqs = [Seq()]


class Queue:
    def __init__(self):
        self.running = {"r0": Request()}


class Scheduler:
    def __init__(self):
        self.queues = {"default": Queue()}


class Hidden:
    def __init__(self, device):
        self.x = torch.zeros(4, device=device)
        self.table = torch.randn(64, 4, device=device)
        self.positions = self._positions()
        self.slots = iter(list(range(64)))
        self.scheduler = Scheduler()
        ticks = 0

        def tick():
            nonlocal ticks
            ticks += 1  # HAZARD: cpu-side-effect

        self.tick = tick

    def _positions(self):
        p = 0
        while True:
            yield p
            p += 1

    def prepare(self, i):
        self.x.copy_(torch.randn(4))

    @torch.no_grad()
    def step(self):
        pos = next(self.positions)  # HAZARD: cpu-side-effect
        slot = next(self.slots)  # HAZARD: cpu-side-effect
        self.tick()
        seq = self.scheduler.queues["default"].running["r0"].seqs[0]
        seq.stats.generated += 1  # HAZARD: cpu-side-effect
        return self.x * 2, pos, slot


class HiddenClean(Hidden):
    """The same bookkeeping in prepare(), outside the graph; the step only runs kernels."""

    def prepare(self, i):
        super().prepare(i)
        next(self.positions), next(self.slots)
        self.tick()
        self.scheduler.queues["default"].running["r0"].seqs[0].stats.generated += 1

    @torch.no_grad()
    def step(self):
        return self.x * 2


def make(device):
    return Hidden(device)


def make_clean(device):
    return HiddenClean(device)
