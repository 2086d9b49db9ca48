"""host-sync: an op that takes a 0-dim tensor where a number goes and reads it inside torch.

`torch.linspace(-amax, amax, n)` with a device `amax` is one dispatched op (`linspace.Tensor_Tensor`)
whose C++ body calls `.item()`: no `_local_scalar_dense` reaches the tracer, yet a GPU waits. Bounds
written as numbers, or built from host data, read nothing back."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_target, marked_line, table

LIB = """
import torch


def levels(h, n):
    amax = {amax}
    out = {op}  # LIBSITE
    return h * out.float().mean()
"""

OPS = ["torch.linspace(-amax, amax, n, device=h.device)", "torch.linspace(amax, 2.0, n, device=h.device)",
       "torch.logspace(-amax, amax, n, device=h.device)",
       "h[0].index_fill(0, torch.arange(2, device=h.device), amax)"]


@pytest.mark.parametrize("kind", ["device", "host"])
def test_tensor_scalar_arguments(tmp_path, monkeypatch, kind):
    amax = "h.abs().max()" if kind == "device" else f"torch.tensor({random.uniform(0.5, 2.0):.3f})"
    mod, lib, path, _ = library_target(
        tmp_path, monkeypatch, LIB.replace("{amax}", amax).replace("{op}", random.choice(OPS)), "levels", "levels",
        f"levels(self.x @ self.w, {random.randrange(4, 9)})")
    bad = blocking(path, forget=mod)
    line = marked_line(lib, "# LIBSITE")
    syncs = bad[(bad.category == "host-sync") & bad.file.str.endswith(lib.name) & (bad.line == line)]
    assert len(syncs) == (1 if kind == "device" else 0), table(bad)
