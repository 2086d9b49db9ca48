"""Planted host state of a worker process (and a twin that does it outside the step).

A progress counter shared with the parent process (a multiprocessing.Value: a ctypes integer in shared
memory, changed through a property under its lock), a token stream fed through a queue.SimpleQueue (a C
queue with no attributes to watch: only its size changes), and banned token ids sent to the device
every step through the PyTorch `factory_kwargs` idiom (`torch.tensor(ids, **self.factory_kwargs)`, the
device hidden in a dict). A replay would count, stream and copy none of it.
"""

import multiprocessing as mp
import queue

import torch

V, D, B = 64, 16, 4


class Worker:
    def __init__(self, device):
        self.device = device
        self.factory_kwargs = {"device": device, "dtype": torch.long}
        self.emb = torch.randn(V, D, device=device)
        self.w = torch.randn(D, V, device=device)
        self.ids = torch.zeros(B, dtype=torch.long, device=device)
        self.banned = [3, 17, 42]
        self.tokens_done = mp.Value("l", 0)
        self.stream = queue.SimpleQueue()

    def prepare(self, i):
        self.ids.copy_(torch.arange(B) * (i + 1) % V)

    @torch.no_grad()
    def step(self):
        logits = self.emb[self.ids] @ self.w
        ban = torch.tensor(self.banned, **self.factory_kwargs)  # HAZARD: pageable-copy
        logits = logits.index_fill(-1, ban, float("-inf"))
        nxt = logits.argmax(-1)
        with self.tokens_done.get_lock():
            self.tokens_done.value += B  # HAZARD: cpu-side-effect
        self.stream.put(nxt)  # HAZARD: cpu-side-effect
        return nxt


class WorkerClean(Worker):
    """The banned ids go to the device once; counting and streaming happen in prepare(), outside the graph."""

    def __init__(self, device):
        super().__init__(device)
        self.ban = torch.tensor(self.banned, **self.factory_kwargs)
        self.last = torch.zeros(B, dtype=torch.long, device=device)

    def prepare(self, i):
        super().prepare(i)
        with self.tokens_done.get_lock():
            self.tokens_done.value += B
        self.stream.put(self.last.clone())

    @torch.no_grad()
    def step(self):
        logits = (self.emb[self.ids] @ self.w).index_fill(-1, self.ban, float("-inf"))
        self.last.copy_(logits.argmax(-1))
        return self.last


def make(device):
    return Worker(device)


def make_clean(device):
    return WorkerClean(device)
