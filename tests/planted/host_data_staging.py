"""Planted host data staged to the device inside the step (and a graph-safe twin).

On a GPU each of these copies from pageable host memory, which capture refuses; on a CPU scan no
copy happens, so the scan has to see where host data became a tensor and where it was sent.
Constants built on the host without a device, or sent to the CPU, stay host tensors: no copy. A
Python list used as an index into a device tensor is copied to the device as well, and so is a
tensor attribute made once in pageable host memory and sent to the device in the step. Assigning a
Python scalar through an index tensor (`x[:, idx] = 0.0`) copies the scalar to the device from pageable
memory (index_put_'s `value.to(x.device)`); index_fill_ carries it as a kernel argument.
A kept numpy array refilled in prepare() and wrapped with `from_numpy` is sent as its own memory: the copy
reads what prepare() wrote, so its values are not baked (the upload is still pageable); the argsort of it is
new host data with this step's values, baked.
"""

import numpy as np
import torch


class Staging:
    def __init__(self, device):
        self.device = device
        self.logits = torch.zeros(2, 10, device=device)
        self.banned = np.array([1, 3, 5, 8], dtype=np.int64)
        self.host_ids = torch.zeros(2, dtype=torch.long)  # pageable host memory, made once
        self.cands = torch.zeros(4, dtype=torch.long, device=device)

    def prepare(self, i):
        self.logits.copy_(torch.randn(2, 10))
        self.banned[:] = np.random.permutation(10)[:4]  # distinct: their order differs between steps
        self.host_ids.copy_(torch.randint(0, 10, (2,)))

    @torch.no_grad()
    def step(self):
        floor = torch.tensor(-1e4, device=self.logits.device)  # HAZARD: pageable-copy
        ban = torch.from_numpy(self.banned).to(self.device)  # HAZARD: pageable-copy
        eos = torch.as_tensor([0], device=self.device)  # HAZARD: pageable-copy
        host_only = torch.tensor([1.0, 2.0]).to("cpu")  # a host tensor stays on the host: no copy
        empty = torch.tensor([], device=self.device)  # nothing to copy: no copy
        scale = torch.ones(2, 1).to(self.device, non_blocking=True)  # HAZARD: pageable-copy
        temp = self.logits.new_tensor([0.5])  # HAZARD: pageable-copy
        out = self.logits.index_fill(1, ban, 0.0).index_fill(1, eos, 0.0) * scale * temp
        out[:, [2, 7]] = 0.0  # HAZARD: pageable-copy
        out[:, self.cands[:2]] = 1.0  # HAZARD: pageable-copy
        picked = out[[1, 0]]  # HAZARD: pageable-copy
        ids = self.host_ids.to(self.device, non_blocking=True)  # HAZARD: pageable-copy
        self.cands.copy_(torch.from_numpy(np.argsort(-self.banned, kind="stable")))  # HAZARD: pageable-copy, baked-host-value
        return torch.maximum(picked, floor).index_fill(1, ids, 0.0), host_only, empty


class StagingClean(Staging):
    def __init__(self, device):
        super().__init__(device)
        self.floor = torch.full((), -1e4, device=device)
        self.ban = torch.zeros(4, dtype=torch.long, device=device)
        self.eos = torch.zeros(1, dtype=torch.long, device=device)
        self.scale = torch.ones(2, 1, device=device)
        self.temp = torch.full((1,), 0.5, device=device)
        self.cols = torch.tensor([2, 7], device=device)
        self.rows = torch.tensor([1, 0], device=device)
        self.ids = torch.zeros(2, dtype=torch.long, device=device)

    def prepare(self, i):
        super().prepare(i)
        self.ban.copy_(torch.from_numpy(self.banned))
        self.ids.copy_(self.host_ids)  # outside the step: the persistent device buffer is refilled
        self.cands.copy_(torch.from_numpy(np.argsort(-self.banned, kind="stable")))

    @torch.no_grad()
    def step(self):
        out = self.logits.index_fill(1, self.ban, 0.0).index_fill(1, self.eos, 0.0) * self.scale * self.temp
        out.index_fill_(1, self.cols, 0.0)
        return torch.maximum(out[self.rows], self.floor).index_fill(1, self.ids, 0.0)


def make(device):
    return Staging(device)


def make_clean(device):
    return StagingClean(device)
