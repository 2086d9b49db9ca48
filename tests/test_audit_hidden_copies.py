"""Copies torch makes inside a call, found on a CPU scan as a GPU run shows them (the H200's CUDA scan is the
ground truth: docs/hazards.md).

- `x[:, idx] = 0.5` through an index tensor: index_put_ copies the Python scalar from pageable host memory to
  the device before it writes (pageable-copy at the library's line, the target's call as caller); through a
  bool mask torch turns it into masked_fill_ and copies nothing, and index_fill_ or a device value copy nothing.
- `t.to("cpu", non_blocking=True)`: torch allocates that destination pinned and does not wait (no host-sync),
  where `t.to("cpu")` waits.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, clean_or_hit, library_target, marked_line, table

PUT = """
import torch

def mask_out(x, cols):
    x = x * 1.0
    {form}  # LIBSITE
    return x
"""
FORMS = {
    "x[:, cols] = {c}": "hazard",
    "x[..., cols] = {c}": "hazard",
    "x[0, cols] = {c}": "hazard",
    "x.index_fill_(1, cols, {c})": "clean",
    "x[:, cols] = x.amax()": "clean",
    "x[x > {c}] = {c}": "clean",
}


@pytest.mark.parametrize("form", list(FORMS))
def test_a_python_scalar_assigned_through_an_index_tensor_is_copied_to_the_device(tmp_path, monkeypatch, form):
    c = round(random.uniform(-1, 1), 3)
    mod, lib, path, site = library_target(tmp_path, monkeypatch, PUT.replace("{form}", form.format(c=c)), "put",
                                          "mask_out", "mask_out(self.x, self.cols)",
                                          init="        self.cols = torch.tensor([0, 2])")
    clean_or_hit(blocking(path, forget=mod), FORMS[form], "pageable-copy", lib, path, site)


READ = """
import torch

def to_host(t):
    return t.amax(-1).to("cpu"{nb})  # LIBSITE
"""


@pytest.mark.parametrize("nb", ["", ", non_blocking=True", ", torch.float32, True"])
def test_a_non_blocking_copy_to_the_cpu_is_no_host_read(tmp_path, monkeypatch, nb):
    mod, lib, path, site = library_target(tmp_path, monkeypatch, READ.replace("{nb}", nb), "read", "to_host",
                                          "to_host(self.x @ self.w)", out="self.x")
    bad = blocking(path, forget=mod)
    hits = at(bad, "host-sync", marked_line(lib, "# LIBSITE"))
    assert len(hits) == (0 if nb else 1), table(bad)
