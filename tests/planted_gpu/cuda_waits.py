"""Planted CUDA-only waits and queries inside a step (host-sync), with a clean twin.

Written for the GPU, built without CUDA: streams and events are taken or made at call time, so a
CPU scan on a machine without CUDA runs the step on the audit's stand-ins and still finds each wait.
Every hazard line carries `# HAZARD: <category>`. `make_needs_gpu` cannot even be built without CUDA.
"""

import torch


class Waits:
    def __init__(self, device):
        self.x = torch.zeros(16, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(16))

    def step(self):
        y = self.x * 2
        torch.cuda.synchronize()  # HAZARD: host-sync
        cur = torch.cuda.current_stream()
        cur.synchronize()  # HAZARD: host-sync
        done = cur.record_event()
        done.synchronize()  # HAZARD: host-sync
        ready = done.query()  # HAZARD: host-sync
        side = torch.cuda.Stream()
        side.wait_stream(cur)
        idle = side.query()  # HAZARD: host-sync
        cur.wait_stream(side)
        del ready, idle
        return y + 1


class WaitsClean:
    """The same streams and events, ordered on the device only: waits the graph can hold."""

    def __init__(self, device):
        self.x = torch.zeros(16, device=device)

    prepare = Waits.prepare

    def step(self):
        y = self.x * 2
        cur = torch.cuda.current_stream()
        done = cur.record_event()
        side = torch.cuda.Stream()
        side.wait_event(done)
        cur.wait_stream(side)
        return y + 1


class FirstCallOnly:
    """A one-time synchronize in the first call (lazy setup): warmup runs it, so no finding."""

    def __init__(self, device):
        self.x = torch.zeros(16, device=device)
        self.ready = False

    prepare = Waits.prepare

    def step(self):
        if not self.ready:
            torch.cuda.synchronize()
            self.ready = True
        return self.x * 2


class NeedsGpu(Waits):
    def __init__(self, device):
        super().__init__(device)
        self.scratch = torch.empty(16, device="cuda")  # device memory at build time: a CPU-only torch raises here


def make(device):
    return Waits(device)


def make_clean(device):
    return WaitsClean(device)


def make_first_call_only(device):
    return FirstCallOnly(device)


def make_needs_gpu(device):
    return NeedsGpu(device)
