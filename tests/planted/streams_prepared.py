"""A weight prefetch issued on a copy stream in prepare() and waited for inside the step.

prepare() uploads the next layer's weights on a copy stream of its own; the step makes its stream
wait for that copy (`wait_stream`, or an event prepare() recorded) before reading them. A capturing
stream cannot wait on an event recorded outside its capture, so the capture fails, and a replay would
not wait for the copy either. The clean twin waits for the copy in prepare() and keeps the step's
own fork and join inside the step.
"""

import torch

D = 64


class Prefetched:
    def __init__(self, device, wait_in_step: bool, with_event: bool):
        self.device, self.wait_in_step, self.with_event = device, wait_in_step, with_event
        self.copy = torch.cuda.Stream()
        self.side = torch.cuda.Stream()
        self.ready = torch.cuda.Event()
        self.staged = torch.randn(D, D).pin_memory() if torch.cuda.is_available() else torch.randn(D, D)
        self.w = torch.zeros(D, D, device=device)
        self.x = torch.zeros(4, D, device=device)
        self.out = torch.zeros(4, D, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(4, D))
        self.staged.copy_(torch.randn(D, D))
        with torch.cuda.stream(self.copy):
            self.w.copy_(self.staged, non_blocking=True)
            self.ready.record()
        if not self.wait_in_step:
            torch.cuda.current_stream().wait_stream(self.copy)

    @torch.no_grad()
    def step(self):
        cur = torch.cuda.current_stream()
        if self.wait_in_step and self.with_event:
            cur.wait_event(self.ready)  # HAZARD: unjoined-stream
        elif self.wait_in_step:
            cur.wait_stream(self.copy)  # HAZARD: unjoined-stream
        self.side.wait_stream(cur)
        with torch.cuda.stream(self.side):
            h = torch.relu(self.x @ self.w)
        cur.wait_stream(self.side)
        self.out.copy_(h * 2)
        return self.out


def make(device):
    return Prefetched(device, wait_in_step=True, with_event=False)


def make_event(device):
    return Prefetched(device, wait_in_step=True, with_event=True)


def make_clean(device):
    return Prefetched(device, wait_in_step=False, with_event=False)
