"""host-sync on a CPU scan: a wait inside the `__exit__` (or `__enter__`, `__init__`) of a library context
manager the target enters inline.

`with Timer():` runs the class's `__init__`, `__enter__` and `__exit__`; a timer that flushes the device when
CUDA is available (`if torch.cuda.is_available(): torch.cuda.synchronize()` in `__exit__`) runs no torch op on a
CPU scan, and no call in the target names those methods. They are read as the library functions the target calls
unconditionally are, with the target's `with` line as caller. A timer that only reads the host clock is clean."""

from __future__ import annotations

import random

import pytest
from site_util import blocking, clean_or_hit, install_library, matmul_target, write_target

LIB = """
import time

import torch


class Timer:
    def __init__(self, name="step"):
        self.name = name
        {init}

    def __enter__(self):
        {enter}
        return self

    def __exit__(self, *exc):
        {exit}
        return False
"""

WAIT = "if torch.cuda.is_available():\n            torch.cuda.synchronize()  # LIBSITE"
PLAIN = "self.t = time.perf_counter()"


@pytest.mark.parametrize("kind", ["hit", "clean"])
def test_wait_in_an_entered_library_context_manager(tmp_path, monkeypatch, kind):
    where = random.choice(["init", "enter", "exit"]) if kind == "hit" else None
    src = LIB
    for slot in ("init", "enter", "exit"):
        src = src.replace("{" + slot + "}", WAIT if slot == where else PLAIN)
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="timer")
    arg = random.choice(["", '"mlp"'])
    tpl = matmul_target(imports=f"import {mod}",
                        step=f"        with {mod}.Timer({arg}):  # SITE\n            y = self.x @ self.w\n"
                             "        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "timer_target.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "host-sync", lib, path, site)
