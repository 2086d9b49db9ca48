"""Planted host state in the shapes serving engines keep it (and a twin that keeps it outside the step).

A free-slot set that gives one slot out and takes one back (same size), a slots dataclass, token ids
in an array('l'), a block table in a large numpy array, an itertools.cycle schedule, a tracker
reachable only through a callback list of bound methods, counters in a decorator's closure, an
element two containers deep written through a local alias, slot 40 of a 64-slot list, a dict
mutated by a helper it is passed to, a global metrics object, and a counter kept in a tensor put on
the CPU on purpose (and a scalar computed from it that a device op reads at launch), and a full
deque of recent tensors that takes a new one. A replay would redo none of it.
"""

import itertools
from array import array
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch


class Metrics:
    def __init__(self):
        self.steps = 0


METRICS = Metrics()


def counted(fn):
    calls = 0

    def wrapper(*args):
        nonlocal calls
        calls += 1  # HAZARD: cpu-side-effect
        return fn(*args)

    return wrapper


@counted
def scale(x):
    return x * 2


def bump(stats, key):
    stats[key] = stats.get(key, 0) + 1  # HAZARD: cpu-side-effect


@dataclass(slots=True)
class SeqState:
    num_computed: int = 0


class Tracker:
    def __init__(self):
        self.tokens_seen = 0

    def on_token(self):
        self.tokens_seen += 1  # HAZARD: cpu-side-effect


class Engine:
    def __init__(self, device):
        self.x = torch.zeros(4, device=device)
        self.free = set(range(8))
        self.seq = SeqState()
        self.out_ids = array("l", [1, 2])
        self.block_table = np.zeros((64, 128), dtype=np.int32)
        self.schedule = itertools.cycle(["a", "b", "c"])
        self.callbacks = [Tracker().on_token]
        self.requests = {"r0": {"recent": [0, 0, 0, 0]}}
        self.num_tokens = [0] * 64
        self.slot = 40
        self.stats = {}
        self.i = 0
        self.steps_cpu = torch.zeros((), dtype=torch.long, device="cpu")  # a host-side counter
        self.half_cpu = torch.full((), 0.5, device="cpu")  # a host scalar that never changes
        self.recent = deque([torch.zeros(4, device=device) for _ in range(3)], maxlen=3)  # full from the start

    def prepare(self, i):
        self.x.copy_(torch.randn(4))
        self.i = i

    @torch.no_grad()
    def step(self):
        slot = self.free.pop()  # HAZARD: cpu-side-effect
        self.free.add(slot + 8)  # HAZARD: cpu-side-effect
        self.seq.num_computed += 1  # HAZARD: cpu-side-effect
        self.out_ids.append(self.i)  # HAZARD: cpu-side-effect
        self.block_table[0, self.i % 128] = self.i + 1  # HAZARD: cpu-side-effect
        adapter = next(self.schedule)  # HAZARD: cpu-side-effect
        for cb in self.callbacks:
            cb()
        req = self.requests["r0"]
        req["recent"][self.i % 4] = self.i + 1  # HAZARD: cpu-side-effect
        self.num_tokens[self.slot] += 1  # HAZARD: cpu-side-effect
        bump(self.stats, "decode")
        METRICS.steps += 1  # HAZARD: cpu-side-effect
        self.steps_cpu += 1  # HAZARD: cpu-side-effect
        kept = self.x * 2
        self.recent.append(kept)  # HAZARD: cpu-side-effect
        decay = 0.5 ** self.steps_cpu  # host arithmetic on the counter: a 0-dim host tensor
        return scale(self.x) * decay, adapter  # HAZARD: baked-host-value


class EngineClean(Engine):
    """The same bookkeeping in prepare(), outside the graph; the step only runs kernels."""

    def prepare(self, i):
        super().prepare(i)
        slot = self.free.pop()
        self.free.add(slot + 8)
        self.seq.num_computed += 1
        self.out_ids.append(i)
        self.block_table[0, i % 128] = i + 1
        next(self.schedule)
        for cb in self.callbacks:
            cb()
        self.requests["r0"]["recent"][i % 4] = i + 1
        self.num_tokens[self.slot] += 1
        bump(self.stats, "decode")
        METRICS.steps += 1
        self.steps_cpu += 1
        self.recent.append(self.x * 2)

    @torch.no_grad()
    def step(self):
        return self.x * self.half_cpu


def make(device):
    return Engine(device)


def make_clean(device):
    return EngineClean(device)
