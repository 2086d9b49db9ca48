"""host-sync on CPU scans: a wait behind a device guard spelled through an object made on CUDA only
(`s = torch.cuda.current_stream() if x.is_cuda else None`, then `if s is not None: s.synchronize()`), or
in the test itself after a CUDA-only prefix (`if x.is_cuda and not stream.query():`). A library's
object made on a flag, not a device, is no guard."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_target, marked_line, table

BODIES = {
    "none_guard": """
    s = torch.cuda.current_stream() if x.is_cuda else None
    if s is not None:
        s.synchronize()  # LIBSITE""",
    "none_guard_reversed": """
    s = None if not x.is_cuda else torch.cuda.current_stream()
    if s:
        s.synchronize()  # LIBSITE""",
    "in_test": """
    if x.is_cuda and not torch.cuda.current_stream().query():  # LIBSITE
        y = y * 1""",
    "none_in_test": """
    s = torch.cuda.current_stream() if x.device.type == "cuda" else None
    if s is not None and not s.query():  # LIBSITE
        y = y * 1""",
    "flag": """
    s = torch.cuda.current_stream() if FLAG else None  # LIBSITE
    if s is not None and not s.query():
        y = y * 1""",
}

LIB = """
import torch

FLAG = False


def scaled(x):
    y = x * {k}{body}
    return y
"""


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_waits_behind_cuda_only_objects(tmp_path, monkeypatch, kind):
    src = LIB.format(k=random.randrange(2, 9), body=BODIES[kind])
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "guardnone", "scaled", "scaled(self.x @ self.w)")
    bad = blocking(path, forget=mod)
    hits = bad[(bad.category == "host-sync") & bad.file.str.endswith(lib.name) & (bad.line == marked_line(lib, "# LIBSITE"))]
    if kind == "flag":
        assert bad[bad.category == "host-sync"].empty, table(bad)
    else:
        assert len(hits) == 1 and int(hits.iloc[0].caller_line) == site, table(bad)
