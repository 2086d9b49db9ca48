"""host-sync: an op with a data-dependent size run on host data reads no device value.

S-LoRA / punica style segment building (`torch.repeat_interleave(torch.as_tensor(adapters),
torch.as_tensor(lens))`, `torch.unique(torch.tensor(ids))`) runs on tensors built from Python lists: in host
memory on a GPU too, so the size is known on the host and nothing waits. Sending the result to the device is
the pageable-copy. The same op on a tensor the step computed on the device waits for it."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_target, marked_line, table

LIB = """
import torch


def segments(h, adapters, lens):
    seg = torch.as_tensor(adapters)
    n = torch.as_tensor(lens)
    {src}
    idx = {op}  # LIBSITE
    return h * idx.to(h.device).float().sum() / {scale}
"""

OPS = ["torch.repeat_interleave(seg, n)", "torch.unique(seg)", "torch.bincount(seg)", "torch.nonzero(n > 1)"]


@pytest.mark.parametrize("kind", ["host", "device"])
def test_data_dependent_size_op_on_host_data(tmp_path, monkeypatch, kind):
    k = random.choice([2, 3, 4])
    adapters, lens = [random.randrange(3) for _ in range(k)], [random.randrange(1, 4) for _ in range(k)]
    src = "seg = seg.to(h.device) + (h.sum() * 0).long(); n = n.to(h.device) + (h.sum() * 0).long()" \
        if kind == "device" else "pass"
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, LIB.replace("{src}", src).replace("{op}", random.choice(OPS))
        .replace("{scale}", str(random.randrange(20, 90))), "segs", "segments",
        f"segments(self.x @ self.w, {adapters}, {lens})")
    bad = blocking(path, forget=mod)
    line = marked_line(lib, "# LIBSITE")
    syncs = bad[(bad.category == "host-sync") & bad.file.str.endswith(lib.name) & (bad.line == line)]
    assert len(syncs) == (1 if kind == "device" else 0), table(bad)
