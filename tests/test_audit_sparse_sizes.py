"""`torch.sparse_coo_tensor(indices, values)` without a size copies the indices' max to the host on a GPU (ATen
sizes the tensor from it); on a CPU scan that copy is no op, and the rule reads the size inference from the
ops before the constructor: host-sync at the library's line, the target's call as caller. With a size given,
nothing is read back.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, library_hit, library_target, marked_line, table

LIB = """
import torch

def scatter_scores(x, ids, scores, n):
    rows = torch.zeros_like(ids)
    idx = torch.stack([rows, ids % n])
    sp = {ctor}  # LIBSITE
    return x + sp.to_dense().sum()
"""
FORMS = {
    "torch.sparse_coo_tensor(idx, scores)": True,
    "torch.sparse_coo_tensor(idx, scores, (1, n))": False,
    "torch.sparse_coo_tensor(idx, scores, size=(1, n))": False,
}


@pytest.mark.parametrize("ctor", list(FORMS))
def test_a_sparse_tensor_sized_from_its_indices_reads_them_back(tmp_path, monkeypatch, ctor):
    n = random.choice([8, 16, 32])
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, LIB.replace("{ctor}", ctor), "sparse", "scatter_scores",
        f"scatter_scores(self.x @ self.w, self.ids, self.x[0, :3], {n})",
        init=f"        self.ids = torch.randint(4, {n}, (3,))",
        prepare=f"        self.ids.copy_(torch.randint(4, {n}, (3,)))")
    bad = blocking(path, forget=mod)
    if FORMS[ctor]:
        library_hit(bad, "host-sync", lib, path, site)
    else:
        assert not len(at(bad, "host-sync", marked_line(lib, "# LIBSITE"))), table(bad)
