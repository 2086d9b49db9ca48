"""cpu-side-effect: counters an actor thread started at make() bumps while the step runs are not the step's.

An IMPALA-style actor loops on its own thread (`self.produced += 1`, a heartbeat), started when the target is
made; the step only reads a device buffer of the same object. The snapshot around each step sees the counters
move, but nothing the step ran moved them: no finding. The same object counting the step's own reads
(`self.reads += 1` in the method the step calls) is still a cpu-side-effect there. Names, periods and sizes
are drawn fresh each run."""

from __future__ import annotations

import importlib
import random

from site_util import blocking, install_library, marked_line, module_target, table, write_target

LIB = """
import threading
import time

import torch

STOP = threading.Event()


class Actor:
    def __init__(self, d):
        self.buf = torch.zeros(1, d)
        self.{counter} = 0
        self.{beat} = 0.0
        self.reads = 0
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while not STOP.is_set():
            self.{counter} += 1
            self.{beat} = time.monotonic()
            time.sleep({period})

    def read(self, x):
        {count}
        return x + self.buf
"""


def _scan(tmp_path, monkeypatch, counts: bool):
    src = LIB.format(counter=random.choice(["produced", "frames", "n_steps"]), beat=random.choice(["heartbeat", "last_seen"]),
                     period=random.choice([0.0002, 0.0005, 0.001]),
                     count="self.reads += 1  # LIBSITE" if counts else "pass")
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="actor")
    lib_mod = importlib.import_module(mod)
    d = random.choice([4, 8])
    tpl = module_target(imports=f"import time\nfrom {mod} import Actor", init=f"        self.a = Actor({d})",
                        step="        y = self.a.read(self.x)  # SITE\n        time.sleep(0.003)\n"
                             "        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "actor.py", tpl, seed=random.randrange(2**31), d=d)
    try:
        return blocking(path, forget=mod), lib, site
    finally:
        lib_mod.STOP.set()


def test_an_actor_threads_own_counters_are_no_finding(tmp_path, monkeypatch):
    bad, _, _ = _scan(tmp_path, monkeypatch, counts=False)
    assert not len(bad), table(bad)


def test_the_steps_own_counter_on_that_object_still_is(tmp_path, monkeypatch):
    bad, lib, site = _scan(tmp_path, monkeypatch, counts=True)
    cse = bad[bad.category == "cpu-side-effect"]
    assert list(cse.line) == [marked_line(lib, "# LIBSITE")], table(bad)
    assert int(cse.iloc[0].caller_line) == site, table(cse)
