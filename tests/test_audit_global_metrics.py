"""A module-level metrics object of a library keeps its count in an object it holds (prometheus_client's `Counter`
holds a value object whose `_value += amount` runs under a lock): the step's `TOKENS.inc(n)` changes state two
objects down from the global (or in a list it holds: a histogram's buckets), in library code that runs no torch op. The scan snapshots the objects a global holds,
reports the change at the library's statement and names the target's call (`TOKENS.inc(n)`) as its caller. A metric
the step leaves alone stays clean."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, marked_line, table, write_target

LIB = """
import threading


class _Value:
    def __init__(self):
        self._value = 0.0
        self._lock = threading.Lock()

    def inc(self, amount):
        with self._lock:
            self._value += amount  # LIBSITE

    def get(self):
        with self._lock:
            return self._value


class Metric:
    def __init__(self, name):
        self.name = name
        self._value = _Value()
        self._buckets = [_Value() for _ in range({buckets})]

    def inc(self, amount=1.0):
        self._value.inc(amount)

    def observe(self, v):
        self._buckets[min(int(v), len(self._buckets) - 1)].inc(1)
"""

TARGET = """
import torch
from {lib} import Metric

TOKENS = Metric("tokens")


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {d}) * 0.1
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        self.out.copy_(torch.tanh(self.x @ self.w))
        {call}
        return self.out


def make(device):
    return Target()
"""


@pytest.mark.parametrize("kind", ["inc", "observe", "clean"])
def test_a_global_metric_changed_through_its_value_object(tmp_path, monkeypatch, kind):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{buckets}", str(random.randint(2, 6))), "metrics")
    call = {"inc": f"TOKENS.inc({random.randint(1, 4)})", "observe": f"TOKENS.observe({random.uniform(0, 9):.2f})",
            "clean": "TOKENS.name"}[kind] + "  # CALL"
    path, _ = write_target(tmp_path / "target" / "metric_target.py", TARGET, marker="# CALL", lib=mod, call=call,
                           seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    if kind == "clean":
        assert not len(bad[bad.category == "cpu-side-effect"]), table(bad)
        return
    hit = library_hit(bad, "cpu-side-effect", lib, path, marked_line(path, "# CALL"))
    assert ("TOKENS._value._value" if kind == "inc" else "TOKENS._buckets.") in hit.iloc[0].message
