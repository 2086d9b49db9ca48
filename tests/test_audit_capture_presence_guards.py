"""A capture test held behind a presence check of the tensor it asks about still skips the read after it.

transformers 5.25 decides whether SDPA may skip the attention mask with
`if exporting() or (padding_mask is not None and is_tracing(padding_mask)): return False`, then reads
`fast_all(padding_mask)` (and the bidirectional twin puts the same test under `not (...) and (mask is None or
mask.all())`). The line that reads the mask runs only with a mask, so under capture the exit is taken and the
read never runs: an eager-only stall (info). The `and` was not read as a capture test, and every model call with
an attention mask was a blocking host-sync. A presence check of a name the reading line does not use
(`other is not None and ...`) proves nothing there: the read stays blocking.
"""

from __future__ import annotations

import random

import pytest

from site_util import STREAM_CAPTURING, install_library, matmul_target, scanned, table, write_target

LIB = STREAM_CAPTURING + """

def {tracing}(t=None):
    return torch.jit.is_tracing() or _stream_capturing()


def exporting():
    return False


def fast_all(t):
    return t.sum() == t.numel()


def early_exit(mask, other=None):
    if exporting() or ({present} is not None and {tracing}(mask)):
        return False
    return bool(fast_all(mask))  # LIBSITE


def inline(mask, other=None):
    if (
        not (exporting() or ({present} is not None and {tracing}(mask)))
        and (mask is None or mask.all())  # LIBSITE
    ):
        return True
    return False
"""

TARGET = matmul_target(imports="import {mod} as lib", step="""\
        scale = 1.0 if lib.{fn}(self.x.abs() >= 0, other=None) else 0.5  # SITE
        self.out.copy_((self.x @ self.w) * scale)
        return self.out""")


@pytest.mark.parametrize("fn", ["early_exit", "inline"])
@pytest.mark.parametrize("present", ["mask", "other"])
def test_a_presence_checked_capture_test_skips_the_read(tmp_path, monkeypatch, fn, present):
    tracing = random.choice(["is_tracing", "_is_tracing", "tracing_or_capturing"])
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(tracing=tracing, present=present), prefix="pmask")
    path, site = write_target(tmp_path / "target" / "mask_target.py", TARGET, mod=mod, fn=fn,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    inv = scanned(path, forget=mod)
    line = [n for n, t in enumerate(lib.read_text().splitlines(), 1) if "# LIBSITE" in t][fn == "inline"]
    reads = inv.df[(inv.df.category == "host-sync") & (inv.df.line == line)]
    assert len(reads) == 1 and reads.iloc[0].caller_line == site, table(inv.df)
    if present == "other":  # `other is not None` says nothing about the line reading `mask`
        assert reads.iloc[0].severity == "blocks-capture", table(inv.df)
        return
    assert reads.iloc[0].severity == "info", table(inv.df)
    assert "skipped while a graph is captured" in reads.iloc[0].message
    assert not len(inv.blocking()), table(inv.blocking())
