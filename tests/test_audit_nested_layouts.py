"""A strided-layout nested tensor made in the step (`torch.nested.nested_tensor(list(values.split(lens)))`, a
jagged batch padded with `to_padded_tensor`) has no sizes: the tracer records its ragged dimensions as -1
instead of stopping the target's step, so the scan runs to the end and the split's `lengths.tolist()` is
reported as the host-sync it is (at the library's line, the target's call its caller). Splitting by lengths
kept on the host reads nothing."""

from __future__ import annotations

import random
import warnings

import pytest

from site_util import blocking, clean_or_hit, install_library, write_target

LIB = """
import torch

def padded(values, lengths, host_lengths, width):
    lens = {lens}  # LIBSITE
    nt = torch.nested.nested_tensor(list(values.split(lens)))
    return nt.to_padded_tensor(0.0, output_size=(len(lens), width, values.shape[1]))
"""

TARGET = """
import torch
from {mod} import padded

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.values = torch.zeros({total}, {d}, device=device)
        self.lengths = torch.zeros({b}, dtype=torch.long, device=device)
        self.host_lengths = [{total} // {b}] * {b}
        self.out = torch.zeros({b}, {d}, device=device)

    def prepare(self, i):
        self.values.copy_(torch.randn({total}, {d}))
        lens = [{total} // {b}] * {b}
        lens[-1] += {total} - sum(lens)
        self.lengths.copy_(torch.tensor(lens))
        self.host_lengths = lens

    def step(self):
        x = padded(self.values, self.lengths, self.host_lengths, {total})  # SITE
        self.out.copy_(x.sum(1))
        return self.out

def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("kind", ["device_lengths", "clean"])
def test_a_nested_tensor_in_the_step_is_traced_to_the_end(tmp_path, monkeypatch, kind):
    lens = "lengths.tolist()" if kind == "device_lengths" else "host_lengths"
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{lens}", lens), prefix="nested")
    b = random.randint(2, 4)
    path, site = write_target(tmp_path / "target" / "nested_t.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              b=b, total=b * random.randint(2, 5), d=random.choice([4, 8]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: nested tensors are a prototype
        bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "host-sync", lib, path, site)
