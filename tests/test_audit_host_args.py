"""A wait read from the source of a GPU-side branch a CPU scan skipped, on a name holding host data, is none.

sentence-transformers' `_pad_tensor_list(tensors, lengths)` takes `int(lengths.max())` on its GPU side, and its one
caller passes `lengths = torch.tensor([t.shape[0] for t in tensors])`: host memory, read without waiting. Built
in the function itself the same holds. A parameter some caller fills from the device, or a tensor built with
`device=` the input's, is still a wait on the GPU.
"""

from __future__ import annotations

import random

import pytest

from site_util import HELPER_TARGET, install_library, marked_line, write_target

LIB = """
import torch


def _pad(z, lengths):
    if z.device.type == "cpu":
        return z * 1.0
    n = int(lengths.max())  # LIBSITE
    return z[:, :n]


def helper(y):
    z = torch.tanh(y)
    {build}
    return _pad(z, lengths)
"""

LOCAL = """
import torch


def helper(y):
    z = torch.tanh(y)
    {build}
    if z.device.type != "cpu":
        z = z[:, :int(lengths.max())]  # LIBSITE
    return z
"""

BUILDS = {  # (how lengths is built, a GPU waits on it)
    "host list": ("lengths = torch.tensor([z.shape[1]] * z.shape[0])", False),
    "host factory": ("lengths = torch.full((z.shape[0],), z.shape[1])", False),
    "device sum": ("lengths = (z != 0).sum(-1)", True),
    "built on the device": ("lengths = torch.tensor([z.shape[1]] * z.shape[0], device=z.device)", True),
}


@pytest.mark.parametrize("where", ["parameter", "local"])
@pytest.mark.parametrize("build", sorted(BUILDS))
def test_a_gpu_side_read_of_host_data_is_no_wait(tmp_path, monkeypatch, build, where):
    import sys

    import audit

    line, waits = BUILDS[build]
    src = (LIB if where == "parameter" else LOCAL).format(build=line)
    mod, lib = install_library(tmp_path, monkeypatch, src, "host_args_lib")
    path, site = write_target(tmp_path / "target" / "host_args_target.py", HELPER_TARGET, mod=mod,
                              d=random.choice([4, 8, 16]), scale=round(random.uniform(0.5, 2.0), 3))
    try:
        df = audit.scan(f"{path}:make", device="cpu").df
    finally:
        sys.modules.pop(mod, None)
    hit = df[(df.category == "host-sync") & df.file.str.endswith(lib.name) & (df.line == marked_line(lib, "# LIBSITE"))]
    if waits:
        assert len(hit) == 1 and "found in the source" in hit.iloc[0].message, df.to_string()
        assert int(hit.iloc[0].caller_line) == site
    else:
        assert not len(hit), hit.to_string()
