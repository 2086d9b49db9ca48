"""A read after a skipped GPU-side `x = x.cpu()` is of host memory: the branch's `.cpu()` is the one wait.

Keras's `convert_to_numpy` writes `if x.device != torch.device("cpu"): x = x.cpu()` and then `np.array(x)`; many
helpers write `if t.is_cuda: t = t.cpu()` before `t.tolist()`. A CPU scan skips the branch (the source reading
of guarded_sync reports its `.cpu()`), then traces the read on the CPU tensor: that read, at a line that on a GPU
reads the host copy, was a second host-sync for the same wait. A read of another name (the device tensor itself,
`y = x.cpu()` then `x.numpy()`) is still its own wait.
"""

from __future__ import annotations

import pytest

from site_util import blocking, library_target, table

LIB = """
import numpy as np
import torch


def to_numpy(x):
    if x.device != torch.device("cpu"):
        x = x.cpu()  # COPY
    return np.array(x)  # READ


def to_list(t):
    if t.is_cuda:
        t = t.detach().cpu()  # COPY
    return t.tolist()  # READ


def other_name(x):
    if x.is_cuda:
        y = x.cpu()  # COPY
    return x.numpy()  # READ
"""


@pytest.mark.parametrize("fn", ["to_numpy", "to_list", "other_name"])
def test_the_read_after_a_skipped_gpu_copy_is_host_memory(tmp_path, monkeypatch, fn):
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB, "tonp", fn, f"{fn}(self.x @ self.w)",
                                          out="self.x")
    bad = blocking(path, forget=mod)
    syncs = bad[bad.category == "host-sync"]
    text = lib.read_text().splitlines()
    func_line = next(n for n, t in enumerate(text, 1) if t.startswith(f"def {fn}("))
    copy = next(n for n, t in enumerate(text, 1) if n > func_line and "# COPY" in t)
    read = next(n for n, t in enumerate(text, 1) if n > func_line and "# READ" in t)
    want = {copy, read} if fn == "other_name" else {copy}
    assert set(syncs.line) == want, table(bad)
    assert (syncs.caller_line == site).all(), table(bad)
    assert set(bad.category) == {"host-sync"}, table(bad)
