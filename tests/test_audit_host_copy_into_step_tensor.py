"""pageable-copy on a CPU scan: host data copied into a tensor the step computed on the device.

An all-reduce stub that sums on the host and writes back (`t.copy_(torch.tensor(vals))`) copies from
pageable memory into the layer's output, a device tensor on a GPU although the step made it: capture
raises there as for a persistent buffer. What ops compute from the host data alone on the same line
(`torch.tensor(vals) * 1.0`) is host data too. A host scratch tensor the step fills the same way
(`torch.zeros(n).copy_(...)`) stays on the host: no copy."""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

TARGET = """
import torch


def {fn}(t):
    vals = t.tolist()
    t.copy_(torch.tensor(vals, dtype=t.dtype){suffix})  # SITE
    return t


class Target:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g).to(device)
        self.x = torch.zeros(1, {d}, device=device)
        self.out = torch.zeros(1, {d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        scratch = torch.zeros({d})
        scratch.copy_(torch.tensor([float(i) for i in range({d})]))  # HOSTONLY
        self.out.copy_({fn}(self.x @ self.w) + scratch)
        return self.out

def make(device):
    return Target(device)
"""


def test_host_data_copied_into_a_step_made_device_tensor_is_pageable_copy(tmp_path):
    fn = f"reduce_{random.randrange(10**6)}"
    path, site = write_target(tmp_path / "copy_in_target.py", TARGET, fn=fn, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), suffix=random.choice(["", " * 1.0", " + 0.0"]))
    bad = blocking(path)
    pc = bad[bad.category == "pageable-copy"]
    assert set(pc.line) == {site}, table(bad)


PACKED = """
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.gru = nn.GRU({d}, {d}, batch_first=True).to(device)
        self.x = torch.zeros({b}, 4, {d}, device=device)
        self.lens = torch.full(({b},), 4, dtype=torch.long, device="cpu")
        self.out = torch.zeros({b}, {d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, 4, {d}))

    @torch.no_grad()
    def step(self):
        packed = pack_padded_sequence(self.x, self.lens, batch_first=True, enforce_sorted=False)
        y, _ = self.gru(packed)
        y, _ = pad_packed_sequence(y, batch_first=True, total_length=4)  # SITE
        self.out.copy_(y[:, -1])
        return self.out

def make(device):
    return Target(device)
"""


def test_indices_sent_to_the_device_are_no_longer_host_data(tmp_path):
    """pack_padded_sequence sorts the host lengths and sends the order with `.to(input.device)`: on a CPU
    scan that keeps the storage, yet what is computed from it afterwards (the unsorted order) is device
    data, and pad_packed_sequence reading it back (`.cpu()`) is a host-sync."""
    path, site = write_target(tmp_path / "packed_target.py", PACKED, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), b=random.choice([2, 3]))
    bad = blocking(path)
    assert site in set(bad[bad.category == "host-sync"].line), table(bad)


UPLOAD_VIEW = """
import torch


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {d}).to(device)
        self.lens_cpu = torch.full(({b},), 3, dtype=torch.long, device="cpu")
        self.lens = torch.zeros({b} + 2, dtype=torch.long, device=device)
        self.x = torch.zeros({b}, {d}, device=device)
        self.out = torch.zeros({b}, {d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {d}))
        self.lens_cpu.fill_(2 + i % 3)

    @torch.no_grad()
    def step(self):
        self.lens{view}.copy_(self.lens_cpu, non_blocking=True)  # SITE
        self.out.copy_((self.x @ self.w) * self.lens[:{b}, None])
        return self.out

def make(device):
    return Target(device)
"""


def test_a_host_attribute_uploaded_into_a_view_of_a_device_buffer_is_pageable_copy(tmp_path):
    """The destination is a view the step makes (`self.lens[:b]`) of a persistent device buffer: its
    storage is the buffer's, so the upload from pageable host memory is the same hazard."""
    b = random.choice([2, 3])
    view = random.choice([f"[:{b}]", f".narrow(0, 0, {b})", f"[0:{b}]"])
    path, site = write_target(tmp_path / "upload_target.py", UPLOAD_VIEW, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), b=b, view=view)
    bad = blocking(path)
    assert site in set(bad[bad.category == "pageable-copy"].line), table(bad)
