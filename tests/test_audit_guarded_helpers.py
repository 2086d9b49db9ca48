"""A library helper that runs no op, called unconditionally by a library function that did (`all_reduce(x)`
then `_maybe_sync(x)`), is read for device-guarded waits as the library functions the step ran are: its wait on
the CUDA side of the test is a host-sync at the helper's line, with the target's call as caller. A helper
whose CUDA side waits for nothing is clean."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_hit, library_target, table

LIB = """
import torch

def {helper}(x):
    if x.is_cuda:
        torch.cuda.synchronize()  # LIBSITE

def {quiet}(x):
    if x.is_cuda:
        x.record_stream(torch.cuda.current_stream())

def run(x):
    y = torch.tanh(x) * {k}
    {quiet}(y)
    return y

def run_nested(x):
    y = torch.tanh(x) * {k}
    {helper}(y)
    return y
"""


@pytest.mark.parametrize("how", ["nested", "quiet"])
def test_guarded_wait_in_a_helper_of_a_library_function(tmp_path, monkeypatch, how):
    names = random.sample(["_maybe_sync", "_sync_if_cuda", "_flush", "_settle"], 2)
    src = LIB.replace("{helper}", names[0]).replace("{quiet}", names[1]).replace("{k}", str(random.choice([1, 2, 3])))
    call = "run_nested(self.x @ self.w)" if how == "nested" else "run(self.x @ self.w)"
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "helpers", "run, run_nested", call)
    bad = blocking(path, forget=mod)
    if how != "nested":
        assert not len(bad), table(bad)  # its CUDA side waits for nothing
        return
    library_hit(bad, "host-sync", lib, path, site)
    assert len(bad) == 1, table(bad)
