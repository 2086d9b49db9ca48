"""pageable-copy on a CPU scan: a Python scalar written into a tensor the step made on the device.

`oh = torch.zeros(v, device=dev); oh[eos] = 1.0` (an EOS one-hot, a forced-token row): torch's setitem makes
the scalar a CPU tensor and copies it into the 0-dim view (`copy_`), a copy from pageable memory on a GPU, as
into a persistent buffer. The factory names the step's device, so the source says where the tensor lives;
written with fill_ (a kernel argument), or made on the CPU, nothing is copied."""

from __future__ import annotations

import random

import pytest
from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch


def onehot(n, i, device):
    oh = torch.zeros(n, device={dev})
    {write}  # LIBSITE
    return oh
"""

WRITES = {"hit": ["oh[i] = 1.0", "oh[i] = {v}", "oh[i] = True"], "clean": ["oh.narrow(0, i, 1).fill_({v})"]}


@pytest.mark.parametrize("kind", ["hit", "clean"])
def test_scalar_written_into_a_device_factory_tensor(tmp_path, monkeypatch, kind):
    v = round(random.uniform(0.5, 3.0), 2)
    write = random.choice(WRITES[kind]).format(v=v)
    dev = random.choice(["device", "torch.device(device)"])
    src = LIB.replace("{dev}", dev).replace("{write}", write)
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "onehot", "onehot",
                                          f"onehot(self.x.shape[1], {random.randrange(4)}, self.x.device) + self.x")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "pageable-copy", lib, path, site)


def test_scalar_written_into_a_host_factory_tensor_is_no_copy(tmp_path, monkeypatch):
    """Made on the CPU (no device named, or "cpu"), the tensor is host memory: the write copies nothing."""
    dev = random.choice(['"cpu"', "None"])
    src = LIB.replace("{dev}", dev).replace("{write}", "oh[i] = 1.0")
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "onehot_host", "onehot",
                                          "onehot(self.x.shape[1], 1, self.x.device).sum() + self.x")
    bad = blocking(path, forget=mod)
    assert not (bad.category == "pageable-copy").any(), bad[["category", "line", "message"]].to_string()
