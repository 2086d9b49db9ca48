"""A capture test joined to a CUDA availability check still keeps the read after it out of a capture.

Code that must also run on CPU-only machines asks `torch.cuda.is_available() and
torch.cuda.is_current_stream_capturing()` before a debug read (a finite-state check of an SSM decode, mamba_ssm's
graph path), or `not torch.cuda.is_available() or not torch.cuda.is_current_stream_capturing()` around it. A graph
is only ever captured with CUDA up, so the availability conjunct is true whenever the capture test is: the read is
an eager-only stall (info), not a blocking host-sync. An availability check alone, or beside another flag, proves
nothing about capture: the read stays blocking.
"""

from __future__ import annotations

import random

import pytest

from site_util import matmul_target, scanned, table, write_target

FORMS = {
    "early-exit": """\
        if {avail} and torch.cuda.is_current_stream_capturing():
            return self.out
        if not torch.isfinite(self.out).all():  # READ
            raise FloatingPointError("state overflowed")""",
    "negated-and": """\
        if not ({avail} and torch.cuda.is_current_stream_capturing()):
            bad = bool(torch.isnan(self.out).any())  # READ
            self.bad = bad""",
    "or-of-negations": """\
        if not {avail} or not torch.cuda.is_current_stream_capturing():
            self.peak = float(self.out.abs().max())  # READ""",
    "no-capture-test": """\
        if {avail} and self.checks:
            return self.out
        if not torch.isfinite(self.out).all():  # READ
            raise FloatingPointError("state overflowed")""",
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_capture_test_beside_an_availability_check(tmp_path, form):
    avail = random.choice(["torch.cuda.is_available()", "torch.cuda.is_initialized()"])
    body = FORMS[form].format(avail=avail)
    step = "        self.out.copy_(torch.tanh(self.x @ self.w))\n" + body + "\n        return self.out"
    src = matmul_target(step=step, init="        self.checks = False\n        self.bad = False\n        self.peak = 0.0")
    path, line = write_target(tmp_path / "guarded_check.py", src, marker="# READ",
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    inv = scanned(path)
    reads = inv.df[(inv.df.category == "host-sync") & (inv.df.line == line)]
    assert len(reads) >= 1, table(inv.df)
    if form == "no-capture-test":
        assert (reads.severity == "blocks-capture").any(), table(inv.df)
        return
    assert (reads.severity == "info").all(), table(reads)
    assert not len(inv.blocking()), table(inv.blocking())
