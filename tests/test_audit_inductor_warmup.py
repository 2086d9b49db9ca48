"""A function `torch.compile`d with the default (inductor) backend, compiled during warmup of a CPU scan.

The CPU scan's device-query stand-ins (audit/scan/standins/cpu_queries.py) answer `get_device_properties` as a GPU
would while a step runs, warmup included. Inductor keys its code cache on the device it finds
(`torch.cuda.get_device_properties(torch.cuda.current_device())`, expecting a CPU-only torch to raise) and
read an attribute the stand-in lacks, so the scan stopped in warmup with `BackendCompilerFailed`. torch's
private internals now get the real answer: the warmup compiles, and the audited steps (which run the
function as its source) find a changing Python int at the compiled function's line, and nothing when the
int stays the same.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch


@torch.compile
def decay(x, steps: int):
    return x * (0.5 ** steps) + {bias}  # LIBSITE
"""


@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_inductor_compiled_in_warmup_scans(tmp_path, monkeypatch, kind):
    base = random.randint(1, 5)
    steps = f"{base} + i" if kind == "hit" else str(base)
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, LIB.format(bias=round(random.uniform(0.1, 0.9), 3)), "inductor", "decay",
        "decay(self.x @ self.w, self.n)", init="        self.n = 0", prepare=f"        self.n = {steps}")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "baked-host-value", lib, path, site)
