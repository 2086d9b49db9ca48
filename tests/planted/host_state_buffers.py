"""Planted host state kept in frozen dataclasses and byte buffers (and a twin that does it outside the step).

The decode position lives in a frozen dataclass, advanced past its guard with object.__setattr__; a
heartbeat is published into a shared-memory header with struct.pack_into (a bytearray written in
place: same object, new contents); the batch's token ids arrive from the scheduler in a shared byte
buffer, viewed with torch.frombuffer and sent to the device in the step (a pageable copy, with no op
record of where the host data came from). A replay would advance, publish and copy none of it.
"""

import array
import dataclasses
import struct

import torch

V, D, B = 64, 16, 4


@dataclasses.dataclass(frozen=True)
class DecodeState:
    position: int = 0
    tokens_emitted: int = 0


class IpcWorker:
    def __init__(self, device):
        self.device = device
        self.emb = torch.randn(V, D, device=device)
        self.w = torch.randn(D, V, device=device)
        self.state = DecodeState()
        self.header = bytearray(16)  # polled by the router
        self.shm = bytearray(4 * B)  # written by the scheduler process
        self.beats = 0

    def prepare(self, i):
        self.shm[:] = array.array("i", torch.randint(0, V, (B,)).tolist()).tobytes()
        self.beats = i

    @torch.no_grad()
    def step(self):
        ids = torch.frombuffer(self.shm, dtype=torch.int32).to(self.device)  # HAZARD: pageable-copy, baked-host-value
        logits = self.emb[ids.long()] @ self.w
        object.__setattr__(self.state, "tokens_emitted", self.state.tokens_emitted + B)  # HAZARD: cpu-side-effect
        struct.pack_into("<qq", self.header, 0, self.beats, self.state.tokens_emitted)  # HAZARD: cpu-side-effect
        return logits.argmax(-1)


class IpcWorkerClean(IpcWorker):
    """The ids are viewed and copied into a persistent device buffer, the state advanced and the
    heartbeat published in prepare(), outside the graph; the step only runs kernels."""

    def __init__(self, device):
        super().__init__(device)
        self.ids = torch.zeros(B, dtype=torch.long, device=device)

    def prepare(self, i):
        super().prepare(i)
        self.ids.copy_(torch.frombuffer(self.shm, dtype=torch.int32))
        object.__setattr__(self.state, "tokens_emitted", self.state.tokens_emitted + B)
        struct.pack_into("<qq", self.header, 0, self.beats, self.state.tokens_emitted)

    @torch.no_grad()
    def step(self):
        return (self.emb[self.ids] @ self.w).argmax(-1)


def make(device):
    return IpcWorker(device)


def make_clean(device):
    return IpcWorkerClean(device)
