"""pageable-copy at host data sent to the device on a GPU-only path that a CPU scan never takes.

A kernel wrapper with a PyTorch fallback builds its launch metadata from the scheduler's Python list only where a
GPU is (`if x.is_cuda: offs = torch.tensor(host, device=x.device)`, or `torch.from_numpy(a).to(x.device)` in a
helper that branch calls): the CPU scan runs the fallback and traces no copy, but on a GPU the branch copies
pageable host memory inside the step. The same wrapper building the metadata on the device (a cumsum of a device
tensor) has nothing to report, nor one that stages through pinned memory.
"""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

TEMPLATE = """
import numpy as np
import torch


def _offsets_sent(lens, device):
{helper}


def gather_last(x, lens_host, lens_dev):
    if x.is_cuda:
{gpu}
        return x.index_select(0, offs)
    return x.index_select(0, torch.cumsum(lens_dev, 0) - 1)


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.x = torch.zeros({n}, {d})
        self.lens = [1, {n} - 1]
        self.lens_dev = torch.tensor(self.lens)

    def prepare(self, i):
        self.x.copy_(torch.randn({n}, {d}))
        k = 1 + i % ({n} - 1)
        self.lens = [k, {n} - k]
        self.lens_dev.copy_(torch.tensor(self.lens))

    @torch.no_grad()
    def step(self):
        return gather_last(self.x, self.lens, self.lens_dev).sum(0)


def make(device):
    return Target()
"""

BUILT = ("        offs = torch.tensor([sum(lens_host[: b + 1]) - 1 for b in range(len(lens_host))], device=x.device)"
         "  # SITE")
SENT_HELPER = "    return torch.from_numpy(np.cumsum(lens) - 1).to(device)  # SITE"
VIA_HELPER = "        offs = _offsets_sent(lens_host, x.device)"
ON_DEVICE = "        offs = torch.cumsum(lens_dev, 0) - 1  # SITE"
PINNED = ("        offs = torch.tensor(lens_host, pin_memory=True).to(x.device, non_blocking=True).cumsum(0) - 1"
          "  # SITE")


def _fields(gpu, helper="    return None"):
    return dict(seed=random.randrange(10**6), n=random.choice([6, 8]), d=random.choice([4, 8]), gpu=gpu,
                helper=helper)


def _copies(bad, line):
    return ((bad.line == line) & (bad.category == "pageable-copy")).any()


def test_a_host_list_built_onto_the_device_on_the_gpu_path_is_a_pageable_copy(tmp_path):
    path, site = write_target(tmp_path / "guarded_upload.py", TEMPLATE, **_fields(BUILT))
    bad = blocking(path)
    assert _copies(bad, site), table(bad)


def test_a_host_tensor_sent_in_a_helper_the_gpu_path_calls_is_reported_there(tmp_path):
    path, site = write_target(tmp_path / "guarded_upload_helper.py", TEMPLATE, **_fields(VIA_HELPER, SENT_HELPER))
    bad = blocking(path)
    assert _copies(bad, site), table(bad)


def test_metadata_made_on_the_device_is_no_copy(tmp_path):
    path, site = write_target(tmp_path / "guarded_device_meta.py", TEMPLATE, **_fields(ON_DEVICE))
    bad = blocking(path)
    assert not (bad.category == "pageable-copy").any(), table(bad)


def test_pinned_staging_is_no_pageable_copy(tmp_path):
    path, site = write_target(tmp_path / "guarded_pinned.py", TEMPLATE, **_fields(PINNED))
    bad = blocking(path)
    assert not _copies(bad, site), table(bad)
