"""numpy's Python layer is no finding's site: `np.cumsum(counts)` on a tensor runs numpy's fromnumeric
wrapper, which calls `counts.__array__()` (a host read). The hazard lives where the tensor was handed to
numpy, in the library or target line, as for torch's and the stdlib's own frames."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import numpy as np
import torch


def offsets(h, n):
    counts = torch.histc(h.abs().mul(1000).long().remainder(n).float(), bins=n, min=0, max=n - 1)
    off = np.{fn}({arg})  # LIBSITE
    return h * {scale}
"""


@pytest.mark.parametrize("kind", ["hit", "clean"])
def test_numpy_function_on_a_tensor_is_reported_at_the_caller_of_numpy(tmp_path, monkeypatch, kind):
    fn = random.choice(["cumsum", "sort", "argmax", "round"])
    arg = "counts" if kind == "hit" else "[1.0] * n"
    src = LIB.replace("{fn}", fn).replace("{arg}", arg).replace("{scale}", str(random.uniform(0.5, 2.0)))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "npwrap", "offsets",
                                          f"offsets(self.x @ self.w, {random.choice([3, 4, 6])})")
    bad = blocking(path, forget=mod)
    if kind == "hit":
        bad = bad[bad.category == "host-sync"]
    clean_or_hit(bad, kind, "host-sync", lib, path, site)
