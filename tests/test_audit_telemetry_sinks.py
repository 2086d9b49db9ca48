"""cpu-side-effect sites in telemetry libraries the step calls per token (tensorboardX, prometheus_client, rich).

- A writer that hands events to a `multiprocessing.Queue` drained by a logger thread started at make(): the step's
  put is the one finding (the queue is compared by the items put), not the thread's `self.outstanding += 1`,
  not `flush()` zeroing it or `close()` closing the queue, neither of which ran.
- A metric whose value object has `inc` and `set`: the one the step's call reaches is the site (`Gauge.set`
  runs `self._value.set(v)`; a Counter's `reset` also calls `set`, and is no site of an `inc`). A metric kept as a
  module global changes two objects down from it (`TOKENS._value._value`, a histogram's buckets): still the
  library's statement, with the target's call as caller.
- A tracker's task kept in a dict and changed through a local (`task = self._tasks[tid]`): stores to its other
  fields (`task.started = t` in `start()`) and a method that only empties its samples are no sites; the
  samples appended through a local bound from the attribute (`samples = task.samples; samples.append(s)`) are.
Names, sizes and values are drawn fresh each run."""

from __future__ import annotations

import random

import pytest

from site_util import (blocking, install_library, library_hit, library_target, marked_line, matmul_target, table,
                       write_target)

QUEUE_LIB = """
import multiprocessing
import queue
import threading
import time


class _Sink:
    def __init__(self):
        self.lock = threading.Lock()
        self.{count} = 0
        self.rows = []

    def write_event(self, ev):
        self._write(repr(ev))

    def _write(self, s):
        with self.lock:
            self.{count} += 1
            self.rows.append(s)

    def flush(self):
        with self.lock:
            self.{count} = 0


class _Logger(threading.Thread):
    def __init__(self, q, sink):
        threading.Thread.__init__(self, daemon=True)
        self._q, self._sink = q, sink

    def run(self):
        while True:
            try:
                ev = self._q.get(True, {wait})
            except queue.Empty:
                continue
            except (OSError, EOFError, ValueError):  # closed at interpreter exit
                return
            if ev is None:
                return
            self._sink.write_event(ev)

    def stop(self):
        self._q.put(None)
        self.join()


class {cls}:
    def __init__(self):
        self._events = multiprocessing.Queue(100)
        self._sink = _Sink()
        self._worker = _Logger(self._events, self._sink)
        self._worker.start()

    def add_scalar(self, tag, value, step):
        self._events.put((tag, float(value), step))  # LIBSITE

    def flush(self):
        self._sink.flush()  # NOTSITE

    def close(self):
        self._worker.stop()
        self._events.close()  # NOTSITE
        self._events = None
"""


def test_a_put_on_a_multiprocessing_queue_is_the_one_site(tmp_path, monkeypatch):
    cls = random.choice(["EventWriter", "SummarySink", "Board"])
    src = QUEUE_LIB.format(cls=cls, count=random.choice(["outstanding", "n_pending", "_num_events"]),
                           wait=random.choice([0.05, 0.1, 0.2]))
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="tbx")
    tpl = matmul_target(imports=f"import time\nfrom {mod} import {cls}",
                        init=f"        self.writer = {cls}()\n        self.n = 0",
                        prepare="        self.n = i",
                        step="        y = self.x @ self.w\n"
                             f"        self.writer.add_scalar('{random.choice(['loss', 'lr', 'ppl'])}', self.n * 0.5, self.n)  # SITE\n"
                             "        time.sleep(0.02)\n        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "board.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    cse = bad[bad.category == "cpu-side-effect"]
    assert list(cse.line) == [marked_line(lib, "# LIBSITE")], table(bad)
    assert int(cse.iloc[0].caller_line) == site, table(cse)
    assert "1 put" in cse.iloc[0].message, table(cse)


METRIC_LIB = """
import threading


class _Value:
    def __init__(self):
        self._value = 0.0
        self._lock = threading.Lock()

    def inc(self, amount):
        with self._lock:
            self._value += amount  # INCSITE

    def set(self, value):
        with self._lock:
            self._value = value  # SETSITE

    def get(self):
        return self._value


class Counter:
    def __init__(self, name):
        self.name = name
        self._value = _Value()

    def inc(self, amount=1):
        self._value.inc(amount)

    def reset(self):
        self._value.set(0)


class Gauge:
    def __init__(self, name):
        self.name = name
        self._value = _Value()

    def inc(self, amount=1):
        self._value.inc(amount)

    def set(self, value):
        self._value.set(float(value))


class Histogram:
    def __init__(self, name, buckets):
        self.name = name
        self._buckets = [_Value() for _ in range(buckets)]

    def observe(self, v):
        self._buckets[min(int(v), len(self._buckets) - 1)].inc(1)
"""


def test_the_value_objects_method_the_step_reaches_is_the_site(tmp_path, monkeypatch):
    kind = random.choice(["gauge", "counter"])
    call = "self.m.set(self.pos)" if kind == "gauge" else f"self.m.inc({random.choice([1, 2, 3])})"
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, METRIC_LIB, "metrics", "Counter, Gauge", "self.x @ self.w",
        init=f"        self.m = {'Gauge' if kind == 'gauge' else 'Counter'}('{random.choice(['pos', 'tokens'])}')\n"
             "        self.pos = 0",
        prepare="        self.pos = 7 + i")
    text = path.read_text().replace("# SITE\n", f"# SITE\n        {call}  # CALL\n")
    path.write_text(text)
    bad = blocking(path, forget=mod)
    cse = bad[bad.category == "cpu-side-effect"]
    want = marked_line(lib, "# SETSITE" if kind == "gauge" else "# INCSITE")
    assert list(cse.line) == [want], table(bad)
    assert int(cse.iloc[0].caller_line) == marked_line(path, "# CALL"), table(cse)


TRACKER_LIB = """
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Task:
    total: int
    {done}: int = 0
    started: Optional[float] = field(default=None, init=False)
    samples: deque = field(default_factory=lambda: deque(maxlen=1000))

    def _reset(self):
        self.samples.clear()


class Tracker:
    def __init__(self):
        self._tasks = {{}}

    def add(self, total):
        tid = len(self._tasks)
        self._tasks[tid] = Task(total)
        return tid

    def start(self, tid):
        task = self._tasks[tid]
        task.started = time.monotonic()

    def update(self, tid, advance=1, total=None):
        task = self._tasks[tid]
        if total is not None and total != task.total:
            task.total = total
            task._reset()
        task.{done} += advance  # DONESITE
        samples = task.samples
        samples.append(advance)  # SAMPLESITE
"""


def test_a_held_tasks_fields_are_found_through_locals_only(tmp_path, monkeypatch):
    done = random.choice(["completed", "n_done", "progress"])
    mod, lib = install_library(tmp_path, monkeypatch, TRACKER_LIB.format(done=done), prefix="tracker")
    tpl = matmul_target(imports=f"from {mod} import Tracker",
                        init=f"        self.bar = Tracker()\n        self.tid = self.bar.add({random.choice([64, 512])})",
                        step="        y = self.x @ self.w\n"
                             f"        self.bar.update(self.tid, advance={random.choice([1, 2])})  # SITE\n"
                             "        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "bar.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    cse = bad[bad.category == "cpu-side-effect"]
    assert sorted(cse.line) == sorted([marked_line(lib, "# DONESITE"), marked_line(lib, "# SAMPLESITE")]), table(bad)
    assert set(cse.caller_line.astype(int)) == {site}, table(cse)


GLOBAL_TARGET = """
import torch
from {lib} import Counter, Histogram

TOKENS = Counter("tokens")
LATENCY = Histogram("latency", {buckets})


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
    """A module-level metric keeps its count in an object it holds (`TOKENS._value._value`, a histogram's buckets):
    the change is two objects down from the global, in library code that runs no torch op. It is reported at the
    library's statement with the target's call as caller; a metric the step leaves alone stays clean."""
    mod, lib = install_library(tmp_path, monkeypatch, METRIC_LIB, "metrics")
    call = {"inc": f"TOKENS.inc({random.randint(1, 4)})", "observe": f"LATENCY.observe({random.uniform(0, 9):.2f})",
            "clean": "TOKENS.name"}[kind] + "  # CALL"
    path, _ = write_target(tmp_path / "target" / "metric_target.py", GLOBAL_TARGET, marker="# CALL", lib=mod, call=call,
                           buckets=random.randint(2, 6), seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    if kind == "clean":
        assert not len(bad[bad.category == "cpu-side-effect"]), table(bad)
        return
    hit = library_hit(bad, "cpu-side-effect", lib, path, marked_line(path, "# CALL"), marker="# INCSITE")
    assert ("TOKENS._value._value" if kind == "inc" else "LATENCY._buckets.") in hit.iloc[0].message
