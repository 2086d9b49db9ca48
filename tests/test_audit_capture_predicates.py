"""A host read that a library skips while a graph is captured, behind its own tracing test, is eager-only.

transformers decides whether SDPA may skip the attention mask with `if not is_tracing(mask) and mask.all():`
(or `if is_tracing(mask): return False` and the read after it), where `is_tracing()` is
`compiling() or jit_tracing() or is_cuda_stream_capturing()` and the last wraps
`torch.cuda.is_current_stream_capturing()` in a try. Under capture the read never runs, so it is `info` (an
eager-only stall), as it is under a direct `if not torch.cuda.is_current_stream_capturing():`. The capture
test was recognised only as torch's own call heading an `if` whose side holds the read: a helper, an operand
the capture short-circuits and an early exit were missed, and the read was reported as blocking capture. A
look-alike helper that does not test capture (`torch.jit.is_tracing()` alone) still leaves it blocking.
"""

from __future__ import annotations

import random

import pytest

from site_util import STREAM_CAPTURING, install_library, marked_line, matmul_target, scanned, table, write_target

LIB = STREAM_CAPTURING + """

def {tracing}(t=None):
    tracing = torch.jit.is_tracing() {capture}
    tracing |= isinstance(t, torch.fx.Proxy)
    return tracing


def inline(mask):
    if not {tracing}(mask) and mask.all():  # LIBSITE
        return True
    return False


def early_exit(mask):
    if {tracing}(mask):
        return False
    return bool(mask.all())  # LIBSITE
"""

TARGET = matmul_target(imports="import {mod} as lib", step="""\
        scale = 1.0 if lib.{fn}(self.x.abs() >= 0) else 0.5  # SITE
        self.out.copy_((self.x @ self.w) * scale)
        return self.out""")


@pytest.mark.parametrize("fn", ["inline", "early_exit"])
@pytest.mark.parametrize("guarded", [True, False])
def test_a_read_behind_a_library_capture_test_is_eager_only(tmp_path, monkeypatch, fn, guarded):
    tracing = random.choice(["is_tracing", "_is_tracing", "is_compiling_or_capturing"])
    capture = "or _stream_capturing()" if guarded else "or torch.is_grad_enabled() and False"
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(tracing=tracing, capture=capture), prefix="masks")
    path, site = write_target(tmp_path / "target" / "mask_target.py", TARGET, mod=mod, fn=fn,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    inv = scanned(path, forget=mod)
    line = marked_line(lib, "# LIBSITE") if fn == "inline" else [
        n for n, t in enumerate(lib.read_text().splitlines(), 1) if "# LIBSITE" in t][1]
    if not guarded:
        hit = inv.blocking()
        hit = hit[(hit.category == "host-sync") & (hit.line == line)]
        assert len(hit) == 1 and hit.iloc[0].caller_line == site, table(inv.df)
        return
    assert not len(inv.blocking()), table(inv.blocking())
    info = inv.df[(inv.df.category == "host-sync") & (inv.df.line == line)]
    assert len(info) == 1 and info.iloc[0].severity == "info", table(inv.df)
    assert "skipped while a graph is captured" in info.iloc[0].message
