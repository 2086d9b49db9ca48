"""A Python list made a tensor in the step and used as an index into a device tensor.

Advanced indexing (`x[torch.tensor(rows)]`) copies the host index to the device inside the op: on a GPU capture
raises on that copy (pageable-copy), reported at the indexing line as a CUDA scan reports it (DLRM's reference
`interact_features`: `li = torch.tensor([...])`, then `Z[:, li, lj]`). `x.index_select(0, torch.tensor(rows))` does
not copy: on a GPU the op refuses an index in host memory outright, eagerly as well (measured on an H100), and the
finding says so, where the list became a tensor. Both with the target's call as caller.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_hit, library_target

LIB = """
import torch


def pick(h, rows):
    idx = torch.tensor(rows)  # LIFT
    return {use}  # USE
"""

USES = {"advanced": ("h[:, idx].sum(-1, keepdim=True) * h", "copied from pageable memory", "# USE"),
        "index_select": ("h.index_select(1, idx).sum(-1, keepdim=True) * h", "refuses an index in host memory",
                         "# LIFT")}


@pytest.mark.parametrize("use", sorted(USES))
def test_host_list_index(tmp_path, monkeypatch, use):
    expr, words, marker = USES[use]
    rows = sorted(random.sample(range(4), random.randint(1, 3)))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB.format(use=expr), "pick", "pick",
                                          f"pick(self.x @ self.w, {rows})")
    bad = blocking(path, forget=mod)
    hit = library_hit(bad, "pageable-copy", lib, path, site, marker=marker)
    assert words in hit.iloc[0].message, hit.iloc[0].message
