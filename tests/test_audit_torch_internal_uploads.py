"""pageable-copy (CPU scan): host data that torch's own Python code sends to the device for the step's call.

`torch.nested.nested_tensor(pieces, layout=torch.jagged)` (and `as_nested_tensor`) builds the jagged offsets in
torch.nested's `jagged_from_list` with `torch.tensor(sizes, device=values.device)`: on a GPU a copy from pageable
memory, which capture refuses. The step's line names no `torch.tensor`, so the line inside torch that made the
tensor is read (`audit/scan/sources/torch_frames.py torch_lines`, `audit/detectors/host_data.py`). Wrapping
offsets the step keeps on the device (`nested_tensor_from_jagged(values, offsets)`) copies nothing, and torch
building a host tensor on the CPU (`pack_padded_sequence`'s lengths, `device="cpu"`) is no upload.
Sizes, names and spellings are drawn fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch
from torch.nn.utils.rnn import pack_padded_sequence


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.device = device
        self.h = torch.zeros({b}, {n}, {d}, device=device)
        self.lens = {lens}
        self.offsets = torch.arange({b} + 1, device=device) * {n}
        self.out = torch.zeros({b}, {d}, device=device)

    def prepare(self, i):
        self.h.copy_(torch.randn({b}, {n}, {d}))

    @torch.no_grad()
    def step(self):
        {name} = {build}  # SITE
        self.out.copy_({read})
        return self.out


def make(device):
    return Target(device)
"""

PIECES = "[self.h[j, :k] for j, k in enumerate(self.lens)]"
UPLOADS = [f"torch.nested.nested_tensor({PIECES}, layout=torch.jagged, device=self.device)",
           f"torch.nested.as_nested_tensor({PIECES}, layout=torch.jagged)",
           f"torch.nested.nested_tensor({PIECES}, layout=torch.jagged)"]
KEPT = "torch.nested.nested_tensor_from_jagged(self.h.flatten(0, 1), self.offsets)"
HOST = "pack_padded_sequence(self.h, self.lens, batch_first=True)"


@pytest.mark.parametrize("kind", ["upload", "kept", "host"])
def test_a_tensor_torch_builds_on_the_device(tmp_path, kind):
    b, n = random.choice([2, 3, 4]), random.choice([4, 5, 6])
    lens = sorted((random.randint(1, n) for _ in range(b)), reverse=True)
    build = random.choice(UPLOADS) if kind == "upload" else KEPT if kind == "kept" else HOST
    name = random.choice(["nt", "batch", "ragged"])
    read = f"{name}.data[:{b}] * 2.0" if kind == "host" else f"{name}.to_padded_tensor(0.0)[:, 0] * 2.0"
    path, site = write_target(tmp_path / "ragged_step.py", TEMPLATE, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), b=b, n=n, lens=repr(lens), name=name, build=build, read=read)
    bad = blocking(path)
    copies = bad[bad.category == "pageable-copy"]
    if kind != "upload":
        assert not len(copies), table(bad)
        if kind == "kept":
            assert not len(bad), table(bad)
        return
    assert list(at(bad, "pageable-copy", site).line) == [site], table(bad)
    assert set(bad.category) == {"pageable-copy"}, table(bad)
