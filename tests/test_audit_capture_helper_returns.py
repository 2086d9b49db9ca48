"""A capture test helper may answer True early for another kind of tracing: `if torch.compiler.is_compiling():
return True`, then `return torch.cuda.is_current_stream_capturing()`. Every return of it is true while a graph is
captured, so a read it short-circuits (`if not _tracing() and not torch.isfinite(y).all():`) is eager-only
(`info`). The constant `return True` was read as no capture test, and the read was reported as blocking capture.
A helper whose only test is dynamo's (`is_compiling()`, False in eager capture) still leaves the read blocking.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import torch


def {helper}():
    if torch.compiler.is_compiling():
        return True
    {last}


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        y = self.x @ self.w
        if not {helper}() and not torch.isfinite(y).all():  # SITE
            raise FloatingPointError("non-finite")
        self.out.copy_(y)
        return self.out


def make(device):
    return Target()
"""

LAST = {
    "capture": "try:\n        return torch.cuda.is_current_stream_capturing()\n    except RuntimeError:\n        return False",
    "dynamo-only": "return False",
}


@pytest.mark.parametrize("last", sorted(LAST))
def test_an_early_true_return_keeps_a_capture_helper(tmp_path, last):
    helper = random.choice(["_tracing", "is_tracing", "_skip_checks"])
    path, site = write_target(tmp_path / "guard_target.py", TARGET, helper=helper, last=LAST[last],
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path)
    if last == "capture":
        assert not len(bad), table(bad)
    else:
        assert len(at(bad, "host-sync", site)) == 1, table(bad)
