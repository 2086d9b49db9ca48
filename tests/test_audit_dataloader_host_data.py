"""A batch drawn in the step from a DataLoader whose dataset holds tensors made on the host (`TensorDataset(
torch.randint(...))`, or a Dataset of the target's keeping a host tensor) and sent with `.to(device)`: on a GPU
that copy is from pageable memory and capture raises. On a CPU scan the copy is a no-op; the dataset's tensors,
reached through torch's DataLoader and its iterator, say it is host memory. A loader over device tensors, or the
batch copied into a static buffer in prepare(), is no finding."""

from __future__ import annotations

import random

from site_util import FED_STEP, at, blocking, table, write_target

TARGET = """
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset


class Rows(Dataset):
    def __init__(self, table):
        self.table = table

    def __len__(self):
        return self.table.shape[0]

    def __getitem__(self, i):
        return (self.table[i],)


class Target:
    def __init__(self, device):
        self.device = device
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g, device=device)
        data = {data}
        self.it = iter(DataLoader({dataset}(data), batch_size={b}))
        self.x = torch.zeros({b}, {d}, device=device)
        self.out = torch.zeros({b}, {d}, device=device)
""" + FED_STEP

HOST = ["torch.randn({n}, {d}, generator=g)", "torch.rand({n}, {d}, generator=g) * 2 - 1"]
TAKES = ["self.x.copy_(next(self.it)[0].to(self.device, non_blocking=True))",
         "(x,) = next(self.it); x = x.to(self.device); self.x.copy_(x)"]


def _target(tmp_path, data: str, take: str, prepare: str = "pass"):
    n, d = random.choice([64, 96]), random.choice([4, 8])
    return write_target(tmp_path / f"loader_host_{random.randrange(10**9)}.py", TARGET, take=take, prepare=prepare,
                        data=data.format(n=n, d=d), dataset=random.choice(["TensorDataset", "Rows"]),
                        seed=random.randrange(2**31), d=d, b=random.choice([2, 3]))


def test_a_batch_of_a_host_dataset_sent_in_the_step_is_a_pageable_copy(tmp_path):
    path, site = _target(tmp_path, random.choice(HOST), random.choice(TAKES))
    bad = blocking(path)
    assert len(at(bad, "pageable-copy", site)) == 1, table(bad)


def test_a_loader_over_device_tensors_or_drawn_in_prepare_is_no_copy(tmp_path):
    if random.random() < 0.5:
        path, site = _target(tmp_path, f"({random.choice(HOST)}).to(device)", random.choice(TAKES))
    else:
        path, site = _target(tmp_path, random.choice(HOST), "pass",
                             prepare="self.x.copy_(next(self.it)[0], non_blocking=True)")
    bad = blocking(path)
    assert not len(bad[bad.category == "pageable-copy"]), table(bad)
