"""A weight prefetch whose copy stream exists only where a GPU is (`torch.cuda.Stream() if
torch.cuda.is_available() else None`): a CPU scan takes the plain-copy arm, so the side-stream block is read
from the source. One block has no fork before it, one no join after it; the clean twin has both.
"""

import torch

D = int(torch.randint(8, 48, (1,)))


class Base:
    def __init__(self, device):
        self.stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        # pinned where a GPU is (its arm uploads it with non_blocking=True): the planted hazard is the stream alone
        self.host_w = torch.randn(D, D).pin_memory() if torch.cuda.is_available() else torch.randn(D, D)
        self.w = torch.zeros(D, D, device=device)
        self.x = torch.zeros(2, D, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(2, D))
        self.host_w.copy_(torch.randn(D, D))


class NoFork(Base):
    @torch.no_grad()
    def step(self):
        if self.stream is not None:
            cur = torch.cuda.current_stream()
            with torch.cuda.stream(self.stream):  # HAZARD: unjoined-stream
                self.w.copy_(self.host_w, non_blocking=True)
            cur.wait_stream(self.stream)
        else:
            self.w.copy_(self.host_w)
        return torch.relu(self.x @ self.w)


class NoJoin(Base):
    @torch.no_grad()
    def step(self):
        if torch.cuda.is_available():
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):  # HAZARD: unjoined-stream
                self.w.copy_(self.host_w, non_blocking=True)
        else:
            self.w.copy_(self.host_w)
        return torch.relu(self.x @ self.w)


class Clean(Base):
    @torch.no_grad()
    def step(self):
        if self.stream is not None:
            cur = torch.cuda.current_stream()
            self.stream.wait_stream(cur)
            with torch.cuda.stream(self.stream):
                self.w.copy_(self.host_w, non_blocking=True)
            cur.wait_stream(self.stream)
        else:
            self.w.copy_(self.host_w)
        return torch.relu(self.x @ self.w)


def make(device):
    return NoFork(device)


def make_nojoin(device):
    return NoJoin(device)


def make_clean(device):
    return Clean(device)
