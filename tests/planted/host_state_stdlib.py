"""Planted host state changed through the standard library (and a twin that does it outside the step).

A queue.Queue held in a dict and one held by a helper object (their mutating code is the stdlib's:
the finding belongs on the user's call into the queue, never on queue.py), a global queue, a heap
kept with heapq (also through an imported name and a local alias), a sorted list kept with
bisect.insort, a list shuffled with random.shuffle, a window trimmed with `del`, and two keys of one
stats dict changed on two lines (each line's finding names its own key). A replay would redo none of it.
"""

import bisect
import heapq
import queue
import random
from heapq import heapreplace

import torch

EVENTS = queue.Queue()  # drained by a logging thread


class Streamer:
    """Text chunks for an HTTP response thread; emit() runs no tensor op, so no op record shows it ran."""

    def __init__(self):
        self.chunks = queue.Queue()

    def emit(self, tok: int):
        self.chunks.put_nowait(f"tok{tok}")  # HAZARD: cpu-side-effect


class Engine:
    def __init__(self, device):
        self.x = torch.zeros(8, device=device)
        self.i = 0
        self.outbox = {"http": queue.Queue(maxsize=1024)}
        self.streamer = Streamer()
        self.finished = []  # min-heap of (score, step)
        self.best = [(0, 0)] * 4  # a full heap: one pushed in, the smallest out
        self.recent = []
        self.lens = [3, 9]
        self.order = list(range(8))
        self.window = [0, 0, 0, 0]
        self.stats = {"dropped": 0, "active": []}

    def prepare(self, i):
        self.x.copy_(torch.randn(8))
        self.i = i

    @torch.no_grad()
    def step(self):
        y = torch.tanh(self.x)
        if self.outbox["http"].qsize() < 1024:  # a read: not how the queue changed
            self.outbox["http"].put_nowait(self.i)  # HAZARD: cpu-side-effect
        self.streamer.emit(self.i)
        EVENTS.put_nowait(("step", self.i))  # HAZARD: cpu-side-effect
        heapq.heappush(self.finished, (random.random(), self.i))  # HAZARD: cpu-side-effect
        heapreplace(self.best, (self.i, random.random()))  # HAZARD: cpu-side-effect
        recent = self.recent
        heapq.heappush(recent, self.i)  # HAZARD: cpu-side-effect
        bisect.insort(self.lens, random.randrange(100))  # HAZARD: cpu-side-effect
        random.shuffle(self.order)  # HAZARD: cpu-side-effect
        del self.window[0]  # HAZARD: cpu-side-effect
        self.window += [self.i]  # HAZARD: cpu-side-effect
        self.stats["dropped"] += 1  # HAZARD: cpu-side-effect
        self.stats["active"].append(self.i)  # HAZARD: cpu-side-effect
        return y * 2


class EngineClean(Engine):
    """The same bookkeeping in prepare(), outside the graph; the step only runs kernels (and reads)."""

    def prepare(self, i):
        super().prepare(i)
        self.outbox["http"].put_nowait(i)
        self.streamer.emit(i)
        EVENTS.put_nowait(("step", i))
        heapq.heappush(self.finished, (random.random(), i))
        heapreplace(self.best, (i, random.random()))
        heapq.heappush(self.recent, i)
        bisect.insort(self.lens, random.randrange(100))
        random.shuffle(self.order)
        del self.window[0]
        self.window += [i]
        self.stats["dropped"] += 1
        self.stats["active"].append(i)

    @torch.no_grad()
    def step(self):
        if self.outbox["http"].qsize() > 4096:  # a read of host state changes nothing
            raise RuntimeError("the response thread stalled")
        return torch.tanh(self.x) * 2


def make(device):
    return Engine(device)


def make_clean(device):
    return EngineClean(device)
