"""Planted host reads a CPU scan must still see (and a graph-safe twin).

On a GPU `.to("cpu")` is a device->host copy that waits; on a CPU scan the tensor is already on the
CPU and the call copies nothing, so only the source says where it goes. `.to(self.device)` is the
same call at run time and must stay clean. The CPU may be named once and stored
(`self.host = torch.device("cpu")`, a local, a module constant): `.to(self.host)` is a read too,
while `.to(self.accel)` with `self.accel = torch.device(device)` is not, nor a host-born tensor
sent to the host. `torch.as_tensor` / `torch.asarray` with a CPU `device=` are the same copy. A counter built on `self.host` is host state: the step advancing it is a
CPU side effect. `torch.allclose` returns a Python bool: a host read. `.to(<cpu>, non_blocking=True)` is
not one: torch allocates the destination pinned and the copy does not wait.
"""

import torch
from torch import nn

HOST = "cpu"


class Reads:
    def __init__(self, device):
        self.device = device
        self.host = torch.device("cpu")
        self.host_name = "cpu:0"
        self.accel = torch.device(device)
        self.reads_cpu = torch.zeros((), dtype=torch.long, device=self.host)  # a host counter on purpose
        self.head = nn.Linear(8, 16).to(device)
        self.h = torch.zeros(2, 8, device=device)
        self.prev = torch.zeros(2, 16, device=device)

    def prepare(self, i):
        self.h.copy_(torch.randn(2, 8))

    @torch.no_grad()
    def step(self):
        logits = self.head(self.h).to(self.device)
        host = logits.to("cpu")  # HAZARD: host-sync
        probs = logits.softmax(-1).to(device=torch.device("cpu"), dtype=torch.float64)  # HAZARD: host-sync
        same = torch.allclose(logits, self.prev, atol=1e-3)  # HAZARD: host-sync
        mirror = logits.max().to(self.host)  # HAZARD: host-sync
        dst = self.host_name
        top = logits.amax(-1).to(dst)  # HAZARD: host-sync
        pinned = logits.amin(-1).to(dst, non_blocking=True)  # torch pins the destination: the copy does not wait
        flat = logits.flatten().to(device=HOST)  # HAZARD: host-sync
        back = logits.to(self.accel)
        counts = torch.zeros(3).to(self.host)  # born on the host: no copy, and nothing goes to the device
        arr = torch.as_tensor(logits, device="cpu")  # HAZARD: host-sync
        ids = torch.asarray(logits.argmax(-1), device=self.host)  # HAZARD: host-sync
        same_dev = torch.as_tensor(logits, dtype=torch.float32, device=self.device)
        kept = torch.as_tensor(counts, device="cpu")  # already on the host: no copy
        self.reads_cpu += 1  # HAZARD: cpu-side-effect
        self.prev.copy_(back)
        return host, probs, same, mirror, top, pinned, flat, counts, arr, ids, same_dev, kept


class ReadsClean(Reads):
    def __init__(self, device):
        super().__init__(device)
        self.logits = torch.zeros(2, 16, device=device)
        self.probs = torch.zeros(2, 16, dtype=torch.float64, device=device)
        self.same = torch.zeros((), dtype=torch.bool, device=device)

    @torch.no_grad()
    def step(self):
        logits = self.head(self.h).to(self.device)
        self.logits.copy_(logits)
        self.probs.copy_(logits.softmax(-1).to(dtype=torch.float64))
        self.same.copy_(torch.isclose(logits, self.prev, atol=1e-3).all())
        self.prev.copy_(logits)


def make(device):
    return Reads(device)


def make_clean(device):
    return ReadsClean(device)
