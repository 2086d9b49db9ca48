"""The host clock read through a name it is kept under: an injectable clock (`self._clock = time.monotonic`,
or `self.clock = clock` from `def __init__(self, ..., clock=time.perf_counter)`) or a module alias (`_now =
time.time`). A budget check feeding `torch.full(..., out_of_time)` is a baked-host-value at the read, with the
target's call as caller (also a dataclass field `clock: Callable = time.monotonic`); the same kept clock used
only for a latency list is no finding. The spelling, the budget and the sizes are drawn fresh each run."""

from __future__ import annotations

import random

from site_util import blocking, install_library, marked_line, module_target, table, write_target

LIB = """
import time

import torch

_now = time.{fn}


class Budget:
    def __init__(self, budget_s, clock=time.{fn}):
        self.clock = clock
        self._clock = time.{fn}
        self.t0 = time.{fn}()
        self.budget_s = budget_s
        self.latency = []

    def __call__(self, x):
        out_of_time = {read} - self.t0 > self.budget_s  # LIBSITE
        return x * torch.full_like(x, out_of_time)

    def timed(self, x):
        t0 = {read}
        y = torch.tanh(x)
        self.latency.append({read} - t0)
        return y
"""


FIELD_LIB = """
import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class Budget:
    budget_s: float = 60.0
    {field}: Callable[[], float] = time.{fn}
    t0: float = 0.0

    def __post_init__(self):
        self.t0 = self.{field}()
        self.latency = []

    def __call__(self, x):
        out_of_time = self.{field}() - self.t0 > self.budget_s  # LIBSITE
        return x * torch.full_like(x, out_of_time)

    def timed(self, x):
        t0 = self.{field}()
        y = torch.tanh(x)
        self.latency.append(self.{field}() - t0)
        return y
"""


def _scan(tmp_path, monkeypatch, meth: str):
    read = random.choice(["self._clock()", "self.clock()", "_now()", "field"])
    fn = random.choice(["time", "monotonic", "perf_counter"])
    src = FIELD_LIB.format(field=random.choice(["clock", "now_fn"]), fn=fn) if read == "field" else \
        LIB.format(fn=fn, read=read)
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="clk")
    d = random.choice([4, 8])
    tpl = module_target(imports=f"from {mod} import Budget",
                        init=f"        self.b = Budget({random.choice([60.0, 3600.0, 1e6])})",
                        step=f"        y = self.b{meth}(self.x)  # SITE\n"
                             "        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "clk.py", tpl, seed=random.randrange(2**31), d=d)
    return blocking(path, forget=mod), lib, path, site


def test_a_kept_clock_reaching_the_device_is_reported_at_its_read(tmp_path, monkeypatch):
    bad, lib, path, site = _scan(tmp_path, monkeypatch, "")
    hit = bad[(bad.category == "baked-host-value") & (bad.line == marked_line(lib, "# LIBSITE"))]
    assert len(hit) == 1, table(bad)
    assert hit.iloc[0].caller_file.endswith(path.name) and int(hit.iloc[0].caller_line) == site, table(hit)


def test_a_kept_clock_used_for_latency_only_is_no_finding(tmp_path, monkeypatch):
    bad, lib, path, site = _scan(tmp_path, monkeypatch, ".timed")
    assert not len(bad[bad.category.isin(["baked-host-value", "data-dependent-control"])]), table(bad)
