"""A module attribute assigned several times in the step is reported at the assignment that left its value.

torchmetrics' `Metric.forward` saves `_update_count`, calls `reset()` (which sets it to 0), updates, and then
stores `self._update_count = saved + 1`. Each assignment goes through `nn.Module.__setattr__`, and the finding
took the first of them: `reset()`'s `= 0`, a line that cannot leave 2 -> 3. The step's last assignment of the
attribute is the one whose value the step ends with, and the one a replay would not redo.
"""

from __future__ import annotations

import random

from site_util import blocking, install_library, library_hit, module_target, write_target

LIB = """
import torch
from torch import nn


class Running(nn.Module):
    def __init__(self):
        super().__init__()
        self.{attr} = 0

    def reset(self):
        self.{attr} = 0
{extra}
    def forward(self, x):
        saved = self.{attr}
        self.reset()
        value = x.mean()
        self.{attr} = saved + 1  # LIBSITE
        return value
"""

TARGET = module_target(imports="import {mod} as lib", init="        self.metric = lib.Running()", step="""\
        self.out.copy_(self.x * self.metric(self.x))  # SITE
        return self.out""")


def test_the_last_assignment_in_the_step_is_the_site(tmp_path, monkeypatch):
    attr = random.choice(["_update_count", "n_seen", "calls"])
    extra = random.choice(["", "\n    def clear(self):\n        self.{0} = -1\n".format(attr)])
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(attr=attr, extra=extra), prefix="metrics")
    path, site = write_target(tmp_path / "target" / "metric_target.py", TARGET, mod=mod,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    library_hit(bad, "cpu-side-effect", lib, path, site)
