"""Shared-expert overlap on a side stream, with the step's own stream looked up once and kept: under
capture the graph is recorded on another stream than the warmup ran on, so the kept stream is not the
capturing one, the fork and join hang off a foreign stream and the side work is not part of the graph.
The clean twin asks for the current stream in every step."""

import torch

D = 32


class SharedOverlap:
    def __init__(self, device, cache_main: bool):
        g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, (1,))))
        self.w_shared = torch.randn(D, D, generator=g).to(device)
        self.w_routed = torch.randn(D, D, generator=g).to(device)
        self.x = torch.zeros(2, D, device=device)
        self.out = torch.zeros(2, D, device=device)
        self.cache_main = cache_main
        self.main = None
        self.side = None

    def prepare(self, i):
        self.x.copy_(torch.randn(2, D))

    def _streams(self):
        if self.side is None:
            self.side = torch.cuda.Stream()
        if not self.cache_main:
            return torch.cuda.current_stream()
        if self.main is None:  # looked up on the first call only
            self.main = torch.cuda.current_stream()
        return self.main

    @torch.no_grad()
    def step(self):
        main = self._streams()
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):  # HAZARD: unjoined-stream
            shared = torch.relu(self.x @ self.w_shared)
        routed = torch.relu(self.x @ self.w_routed)
        main.wait_stream(self.side)
        self.out.copy_(shared + routed)
        return self.out


def make(device):
    return SharedOverlap(device, cache_main=True)


def make_clean(device):
    return SharedOverlap(device, cache_main=False)
