"""Planted host state changed by a mutating method handed over uncalled (and a twin that does it outside
the step).

`stack.callback(self.done.append, rid)` runs the append when the ExitStack unwinds, `map(self.seen.add,
ids)` inside map, `functools.partial(self.free.insert, 0)` whenever the partial is called (reported at that call): the frames
that mutate are the stdlib's (or C), so the finding belongs on the user's line that passes the bound
method. A replay would redo none of it.
"""

import contextlib
import functools

import torch


class Engine:
    def __init__(self, device):
        self.x = torch.zeros(8, device=device)
        self.rid = 0
        self.done = []
        self.seen = set()
        self.free = [0, 1, 2, 3]
        self.give_back = functools.partial(self.free.insert, 0)  # runs in the step: see give_back() there

    def prepare(self, i):
        self.x.copy_(torch.randn(8))
        self.rid = i

    @torch.no_grad()
    def step(self):
        with contextlib.ExitStack() as stack:
            stack.callback(self.done.append, self.rid)  # HAZARD: cpu-side-effect
            y = torch.tanh(self.x)
        list(map(self.seen.add, [self.rid, self.rid + 100]))  # HAZARD: cpu-side-effect
        self.give_back(self.free.pop())  # HAZARD: cpu-side-effect
        return y * 2


class EngineClean(Engine):
    """The same bookkeeping in prepare(); the step passes no mutator anywhere."""

    def prepare(self, i):
        super().prepare(i)
        with contextlib.ExitStack() as stack:
            stack.callback(self.done.append, i)
        list(map(self.seen.add, [i, i + 100]))
        self.give_back(self.free.pop())

    @torch.no_grad()
    def step(self):
        with contextlib.ExitStack() as stack:
            stack.callback(print, end="")  # a callback that changes no state of the target
            return torch.tanh(self.x) * 2


def make(device):
    return Engine(device)


def make_clean(device):
    return EngineClean(device)
