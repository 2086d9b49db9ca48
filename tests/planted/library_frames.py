"""A target whose hazards live in a library it calls (tests/planted_site/plantedlib, installed into a
temporary site directory by the tests), and a graph-safe twin that calls the library's safe API.

Findings name the library's line (`# HAZARD:` markers there); the line below that made the call
is marked `# CALLS:` and is each finding's caller.
"""

import torch

from plantedlib import blocks, kv, moe, numerics, profiling, seqstate, serving


class LibraryStep:
    def __init__(self, device):
        self.x = torch.zeros(8, device=device)
        self.scores = torch.zeros(4, device=device)
        self.weights = torch.randn(4, 8, 8, device=device)
        self.cache = kv.GrowingCache(8, device)
        self.sampler = serving.SeededSampler(device)
        self.seq = seqstate.SeqState(1)
        self.lru = blocks.BlockLRU(4)
        self.blocks = [0]
        self.pos = 0

    def prepare(self, i):
        self.x.copy_(torch.randn(8))
        self.scores.copy_(torch.randn(4))
        self.pos = 3 + i
        self.blocks = [i % 4]

    def step(self):
        keys = self.cache.append(self.x)  # CALLS: plantedlib
        y = numerics.normalize(self.x)  # CALLS: plantedlib
        y = moe.routed(y, self.weights, self.scores)  # CALLS: plantedlib
        y = numerics.position_bias(y, self.pos)  # CALLS: plantedlib
        with profiling.region("mix"):  # CALLS: plantedlib
            y = self.mix(y)  # CALLS: plantedlib
        tok = self.sampler(torch.softmax(y, -1))  # CALLS: plantedlib
        tok = tok + seqstate.advance(self.seq, y[None])  # CALLS: plantedlib
        self.lru.touch(self.blocks)  # CALLS: plantedlib
        return y + keys.sum() + tok

    @serving.timed("mix")
    def mix(self, y):
        return y * 0.5


class LibraryStepClean:
    def __init__(self, device):
        self.x = torch.zeros(8, device=device)
        self.scores = torch.zeros(4, device=device)
        self.weights = torch.randn(4, 8, 8, device=device)
        self.cache = kv.StaticCache(8, device)
        self.sampler = serving.GreedySampler()
        self.seq = seqstate.SeqState(1, pos=torch.zeros((), dtype=torch.long, device=device))
        self.lru = blocks.BlockLRU(4)
        self.pos = torch.zeros((), device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(8))
        self.scores.copy_(torch.randn(4))
        self.pos.fill_(3 + i)
        self.lru.touch([i % 4])  # host bookkeeping before the replay, not inside it

    def step(self):
        keys = self.cache.append(self.x)
        y = numerics.normalize_on_device(self.x)
        y = moe.dense(y, self.weights, self.scores)
        y = numerics.position_bias_on_device(y, self.pos)
        with profiling.region("mix", enabled=False):
            y = self.mix(y)
        tok = self.sampler(torch.softmax(y, -1))
        tok = tok + seqstate.advance_on_device(self.seq, y[None])
        return y + keys.sum() + tok

    @serving.untimed("mix")
    def mix(self, y):
        return y * 0.5


def make(device):
    return LibraryStep(device)


def make_clean(device):
    return LibraryStepClean(device)
