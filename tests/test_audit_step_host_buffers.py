"""host-sync on a CPU scan: a host buffer the step makes itself and fills from the device.

A grouped-GEMM wrapper that wants its batch sizes on the CPU writes `host = torch.empty(E, dtype=torch.long,
device="cpu"); host.copy_(counts)` instead of `counts.cpu()`: on a GPU a device->host copy into pageable
memory, which waits (capture refuses it). The factory says where the buffer lives: no device or the CPU for
`torch.empty`, the CPU named for `torch.zeros_like` / `t.new_empty`; host data made a tensor (`torch.from_numpy(buf)`,
`torch.tensor(rows)`) is host memory too. A buffer that follows the device of
the tensor it is made like, or host data copied into a host buffer, is no read."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import numpy as np
import torch


def batch_sizes(h, n):
    ids = (h.abs() * 1000).long() % n
    counts = torch.histc(ids.float(), bins=n, min=0, max=n - 1).long()
    {make}
    host.copy_({src})  # LIBSITE
    return h * host.float().sum() / {scale}
"""

MAKES = {
    "hit": ["host = torch.empty(n, dtype=torch.long, device='cpu')",
            "host = torch.zeros(n, dtype=torch.long)",
            "host = torch.zeros_like(counts, device='cpu')",
            "host = counts.new_empty(n, device=torch.device('cpu'))",
            "host = torch.from_numpy(np.zeros(n, dtype=np.int64))", "host = torch.tensor([0] * n)"],
    "clean": ["host = torch.empty_like(counts)", "host = counts.new_zeros(n)"],
}


@pytest.mark.parametrize("kind", ["hit", "clean", "host-data"])
def test_device_values_copied_into_a_step_made_host_buffer(tmp_path, monkeypatch, kind):
    make = random.choice(MAKES["clean" if kind == "clean" else "hit"])
    src = "torch.tensor([n] * n)" if kind == "host-data" else "counts"
    n = random.choice([3, 4, 5])
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB.replace("{make}", make).replace("{src}", src)
                                          .replace("{scale}", str(random.randrange(50, 100))),
                                          "sizes", "batch_sizes", f"batch_sizes(self.x @ self.w, {n})")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "clean" if kind != "hit" else kind, "host-sync", lib, path, site)
