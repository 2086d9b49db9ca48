"""A capture test held behind a type check of the tensor it asks about still skips the read after it.

transformers 5.25 decides whether SDPA may skip the causal mask with
`if isinstance(q_offset, torch.Tensor) and is_tracing(q_offset): return False`, then tests `q_offset == 0` (a
StaticCache keeps its offset as a device tensor). Only a tensor can be read back there, and a tensor takes the
exit while a graph is captured: an eager-only stall (info). A top-level `and` was not read as a capture test, so
every multi-token forward on a StaticCache (a speculative verify step) was a blocking host-sync. A type check of
another name, or of a type that is not a tensor, proves nothing about the read: it stays blocking.
"""

from __future__ import annotations

import random

import pytest

from site_util import STREAM_CAPTURING, install_library, matmul_target, scanned, table, write_target

LIB = STREAM_CAPTURING + """

def {tracing}(t=None):
    return torch.jit.is_tracing() or _stream_capturing()


def early_exit(offset, other=None):
    if isinstance({checked}, {kind}) and {tracing}(offset):
        return False
    if offset == 0:  # LIBSITE
        return True
    return False
"""

TARGET = matmul_target(imports="import {mod} as lib", step="""\
        scale = 1.0 if lib.early_exit(self.x.sum() * 0, other=None) else 0.5  # SITE
        self.out.copy_((self.x @ self.w) * scale)
        return self.out""")


@pytest.mark.parametrize("guard", ["tensor", "other", "int"])
def test_a_type_checked_capture_test_skips_the_read(tmp_path, monkeypatch, guard):
    tracing = random.choice(["is_tracing", "_is_tracing", "tracing_or_capturing"])
    checked = "other" if guard == "other" else "offset"
    kind = "int" if guard == "int" else random.choice(["torch.Tensor", "Tensor"])
    src = LIB.format(tracing=tracing, checked=checked, kind=kind)
    if kind == "Tensor":
        src = src.replace("import torch\n", "import torch\nfrom torch import Tensor\n", 1)
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="qoff")
    path, site = write_target(tmp_path / "target" / "offset_target.py", TARGET, mod=mod,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    inv = scanned(path, forget=mod)
    line = next(n for n, t in enumerate(lib.read_text().splitlines(), 1) if "# LIBSITE" in t)
    reads = inv.df[(inv.df.category == "host-sync") & (inv.df.line == line)]
    assert len(reads) == 1 and reads.iloc[0].caller_line == site, table(inv.df)
    if guard != "tensor":  # another name's type, or not a tensor type: the read can still run under capture
        assert reads.iloc[0].severity == "blocks-capture", table(inv.df)
        return
    assert reads.iloc[0].severity == "info", table(inv.df)
    assert "skipped while a graph is captured" in reads.iloc[0].message
    assert not len(inv.blocking()), table(inv.blocking())
