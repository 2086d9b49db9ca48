"""Planted side-stream work that is not forked from or joined to the step's stream (unjoined-stream),
with legal twins (wait_stream both ways; events both ways).

Under capture a side stream that never waited on the capturing stream is not part of the graph:
its kernels run once while capturing and replay skips them, raising nothing. The finding names the
line that switched to the side stream; every hazard line carries `# HAZARD: <category>`. The side
stream is made on first use (lazily, in warmup) so that a CPU scan can run the step on stand-ins.
"""

import torch


class _Base:
    def __init__(self, device):
        self.x = torch.zeros(32, 32, device=device)
        self.side = None

    def prepare(self, i):
        self.x.copy_(torch.randn(32, 32))

    def stream(self):
        if self.side is None:
            self.side = torch.cuda.Stream()
        return self.side


class NoForkWait(_Base):
    """The step's stream waits for the side stream after the block, but the block never waited first."""

    def step(self):
        cur, side = torch.cuda.current_stream(), self.stream()
        h = self.x @ self.x
        with torch.cuda.stream(side):  # HAZARD: unjoined-stream
            y = torch.tanh(h)
        cur.wait_stream(side)
        return y + h


class NoJoinWait(_Base):
    """Forked correctly; the step's stream reads the block's output without waiting for it."""

    def step(self):
        cur, side = torch.cuda.current_stream(), self.stream()
        h = self.x @ self.x
        side.wait_stream(cur)
        with torch.cuda.stream(side):  # HAZARD: unjoined-stream
            y = torch.relu(h) * 2
        return y + h


class EventNoJoin(_Base):
    """Fork and join by events, but the join event is recorded and never waited on."""

    def step(self):
        cur, side = torch.cuda.current_stream(), self.stream()
        h = self.x @ self.x
        forked = cur.record_event()
        side.wait_event(forked)
        torch.cuda.set_stream(side)  # HAZARD: unjoined-stream
        y = torch.sigmoid(h)
        done = side.record_event()
        torch.cuda.set_stream(cur)
        del done  # cur.wait_event(done) is missing
        return y + h


class NoWaitAtAll(_Base):
    """Neither fork nor join (measured on an H200: no error, the graph lacks the block's kernels)."""

    def step(self):
        h = self.x @ self.x
        with torch.cuda.stream(self.stream()):  # HAZARD: unjoined-stream
            y = torch.tanh(h) * 3
        return y + h


class WaitStreamBoth(_Base):
    """Legal: wait_stream before and after the block."""

    def step(self):
        cur, side = torch.cuda.current_stream(), self.stream()
        h = self.x @ self.x
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            y = torch.tanh(h)
        cur.wait_stream(side)
        return y + h


class EventsBoth(_Base):
    """Legal: an event recorded on each stream and waited on by the other."""

    def step(self):
        cur, side = torch.cuda.current_stream(), self.stream()
        h = self.x @ self.x
        forked = torch.cuda.Event()
        forked.record(cur)
        side.wait_event(forked)
        with torch.cuda.stream(side):
            y = torch.sigmoid(h)
            done = torch.cuda.Event()
            done.record()
        cur.wait_event(done)
        return y + h


def make(device):
    return NoForkWait(device)


def make_no_join(device):
    return NoJoinWait(device)


def make_event_no_join(device):
    return EventNoJoin(device)


def make_no_wait(device):
    return NoWaitAtAll(device)


def make_clean(device):
    return WaitStreamBoth(device)


def make_clean_events(device):
    return EventsBoth(device)
