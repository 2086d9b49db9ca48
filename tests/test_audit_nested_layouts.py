"""A strided-layout nested tensor made in the step (`torch.nested.nested_tensor(list(values.split(lens)))`, a
jagged batch padded with `to_padded_tensor`) has no sizes: the tracer records its ragged dimensions as -1
instead of stopping the target's step, so the scan runs to the end and the split's `lengths.tolist()` is
reported as the host-sync it is (at the library's line, the target's call its caller). Splitting by lengths
kept on the host reads nothing. A jagged-layout nested tensor built from device offsets
(`nested_tensor_from_jagged(values, offsets)`) and padded to a fixed `output_size` has a symbolic ragged
dimension, a new one each step: no dynamic shape, no finding."""

from __future__ import annotations

import random
import warnings

import pytest

from site_util import blocking, clean_or_hit, install_library, write_target

LIB = """
import torch

def padded(values, lengths, host_lengths, width):
    if {jagged}:
        offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
        nt = torch.nested.nested_tensor_from_jagged(values, offsets)
        return nt.to_padded_tensor(0.0, output_size=(lengths.numel(), width, values.shape[1]))
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
        if {vary}:
            lens[i % {b}] += 1
            lens[(i + 1) % {b}] -= 1
        self.lengths.copy_(torch.tensor(lens))
        self.host_lengths = lens

    def step(self):
        x = padded(self.values, self.lengths, self.host_lengths, {total})  # SITE
        self.out.copy_(x.sum(1))
        return self.out

def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("kind", ["device_lengths", "clean", "jagged"])
def test_a_nested_tensor_in_the_step_is_traced_to_the_end(tmp_path, monkeypatch, kind):
    lens = "lengths.tolist()" if kind == "device_lengths" else "host_lengths"
    src = LIB.replace("{lens}", lens).replace("{jagged}", str(kind == "jagged"))
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="nested")
    b = random.randint(2, 4)
    path, site = write_target(tmp_path / "target" / "nested_t.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              b=b, total=b * random.randint(2, 5), d=random.choice([4, 8]), vary=kind == "jagged")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: nested tensors are a prototype
        bad = blocking(path, forget=mod)
    clean_or_hit(bad, "clean" if kind == "jagged" else kind, "host-sync", lib, path, site)
