"""A tensor built from host data straight onto the device, read back in the step.

A tensor-parallel library agrees on a length: `t = torch.tensor([n], device=x.device)`, a collective on
it, `int(t.item())`. On a GPU `t` lives in device memory, so the read waits for the device: a host-sync at
the read's line (besides the pageable copy that built it). `torch.tensor([n])` kept on the host and read
back waits for nothing.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, install_library, library_hit, matmul_target, marked_line, table, write_target

LIB = """
import torch

def agree(n, like):
    t = torch.tensor([n], {device})
    t = torch.maximum(t, t.flip(0))  # a one-rank stand-in for all_reduce(MAX)
    return int(t.item())  # LIBSITE
"""


def _target(tmp_path, monkeypatch, device: str):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{device}", device), prefix="agree")
    tpl = matmul_target(imports=f"from {mod} import agree", init="        self.pos = 0", prepare="        self.pos = i",
                        step="""        n = agree(self.pos, self.x)  # SITE
        self.out.copy_(torch.tanh(self.x @ self.w))
        return self.out""")
    path, site = write_target(tmp_path / "target" / "lib_agree.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    return mod, lib, path, site


@pytest.mark.parametrize("device", ["device=like.device", "device=like.device, dtype=torch.long"])
def test_a_read_of_data_built_on_the_device_is_a_host_sync(tmp_path, monkeypatch, device):
    mod, lib, path, site = _target(tmp_path, monkeypatch, device)
    library_hit(blocking(path, forget=mod), "host-sync", lib, path, site)


@pytest.mark.parametrize("device", ["", 'device="cpu"'])
def test_a_read_of_data_kept_on_the_host_is_no_host_sync(tmp_path, monkeypatch, device):
    mod, lib, path, site = _target(tmp_path, monkeypatch, device)
    bad = blocking(path, forget=mod)
    assert not len(at(bad, "host-sync", marked_line(lib, "# LIBSITE"))), table(bad)
