"""A capture-test helper that joins an availability check (audit/detectors/device/capture_guards.py).

Serving code wraps the test once, `def _capturing(): return torch.cuda.is_available() and
torch.cuda.is_current_stream_capturing()`, and skips a validation read with `if not _capturing():`. A graph is
only captured with CUDA up, so the helper is true whenever a capture is, as the same `and` written inline is:
the read is an eager-only stall (info), not a blocking host-sync. A helper that ands the capture test with a
flag of its own proves nothing about capture, and the read stays blocking.
"""

from __future__ import annotations

import random

import pytest

from site_util import matmul_target, scanned, table, write_target

HELPERS = {
    "availability": "return {avail} and torch.cuda.is_current_stream_capturing()",
    "availability via local": "cap = {avail} and torch.cuda.is_current_stream_capturing()\n    return cap",
    "own flag": "return CHECKS and torch.cuda.is_current_stream_capturing()",
}


@pytest.mark.parametrize("form", sorted(HELPERS))
def test_a_helper_anding_availability_with_the_capture_test(tmp_path, form):
    avail = random.choice(["torch.cuda.is_available()", "torch.cuda.is_initialized()"])
    name = random.choice(["_capturing", "graph_capturing", "in_capture"])
    helper = f"CHECKS = {random.choice(['True', 'False'])}\n\n\ndef {name}():\n    " + HELPERS[form].format(avail=avail)
    guard = random.choice([f"if not {name}():\n", f"if {name}():\n            pass\n        else:\n"])
    step = ("        self.out.copy_(torch.tanh(self.x @ self.w))\n        " + guard +
            "            if not torch.isfinite(self.out).all():  # READ\n"
            "                raise FloatingPointError('overflow')\n        return self.out")
    src = matmul_target(step=step, imports=helper)
    path, line = write_target(tmp_path / f"helper_guard_{random.randrange(10**6)}.py", src, marker="# READ",
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    inv = scanned(path)
    reads = inv.df[(inv.df.category == "host-sync") & (inv.df.line == line)]
    assert len(reads) >= 1, table(inv.df)
    if form == "own flag":
        assert (reads.severity == "blocks-capture").any(), table(inv.df)
        return
    assert (reads.severity == "info").all(), table(reads)
    assert not len(inv.blocking()), table(inv.blocking())
