"""A small tensor a library keeps at module level, made at import by a host factory (`_SPLITS =
torch.tensor([n])`), lives in host memory on a GPU too: reading it back in the step (`_SPLITS.tolist()` for an
all_to_all's split sizes) waits for nothing, no finding. Advancing it in place is host bookkeeping a replay
skips (cpu-side-effect at that line). Reading back a value computed on the device stays a host-sync."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_hit, library_target, table

LIB = """
import torch

_SPLITS = torch.tensor([{n}])
_STEPS = torch.zeros(1)

def split_rows(x, how):
    y = torch.tanh(x)
    if how == "table":
        sizes = _SPLITS.tolist()
        y = y * sizes[0]
    elif how == "counter":
        _STEPS.add_(1)  # LIBSITE-counter
    elif how == "device":
        sizes = (y.abs() > 0).sum(0).tolist()  # LIBSITE-device
        y = y * len(sizes)
    return y
"""


@pytest.mark.parametrize("how", ["table", "counter", "device"])
def test_a_module_level_host_tensor_is_host_memory(tmp_path, monkeypatch, how):
    src = LIB.replace("{n}", str(random.randint(1, 9)))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "splits", "split_rows",
                                          f'split_rows(self.x @ self.w, "{how}")')
    bad = blocking(path, forget=mod)
    if how == "table":
        assert not len(bad), table(bad)
        return
    library_hit(bad, "cpu-side-effect" if how == "counter" else "host-sync", lib, path, site,
                marker=f"# LIBSITE-{how}")
    assert len(bad) == 1, table(bad)
