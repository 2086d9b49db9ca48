"""data-dependent-control: a per-item guard in a loop that skips the loop's last item.

`for f in filters: if f.enabled: logits = f(logits)` with the last filter (of another class than the one
before it) switched on and off per request:
the other step's next op comes after the loop, so the ops alone look like one more trip of the loop. The
guard's test reads the loop's own element, a per-item switch, so it is the statement named, not the `for`,
with the target's call as caller. A loop over a list sliced per request (`self.procs[: self.n]`) with no
such guard is still named itself."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, install_library, module_target, table, write_target

LIB = """
import torch


class Filt:
    def __init__(self, k):
        self.k, self.{flag} = k, True

    def __call__(self, x):
        return (x * self.k).clamp(-3.0, 3.0)


class Shift(Filt):
    def __call__(self, x):
        return torch.tanh(x + self.k)


def run_all(filters, x):
    for {var} in filters:  # LOOP
        if {test}:  # GUARD
            x = {var}(x)
    return x


def run_first(filters, n, x):
    for {var} in filters[:n]:  # SLICED
        x = {var}(x)
    return x
"""

TESTS = {"enabled": "{v}.enabled", "active": "{v}.active and {v}.k > 0", "skip": "not getattr({v}, 'skip', False)"}


@pytest.mark.parametrize("shape", ["guard", "sliced"])
def test_guard_testing_the_loop_element_is_named_when_the_last_item_is_skipped(tmp_path, monkeypatch, shape):
    flag, var = random.choice(list(TESTS)), random.choice(["f", "proc", "p"])
    test = TESTS[flag].format(v=var)
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(flag=flag, var=var, test=test), prefix="lastguard")
    n = random.choice([2, 3])
    toggle = "skip" if flag == "skip" else flag
    value = "i % 2 == 1" if flag == "skip" else "i % 2 == 0"
    call = "run_all(self.fs, self.x)" if shape == "guard" else "run_first(self.fs, self.n, self.x)"
    prep = f"        self.fs[-1].{toggle} = {value}" if shape == "guard" else f"        self.n = {n} - i % 2"
    tpl = module_target(imports=f"from {mod} import Filt, Shift, run_all, run_first",
                        init=f"        self.fs = [Filt(1.0 + 0.5 * j) for j in range({n} - 1)] + [Shift(0.5)]\n        self.n = {n}",
                        prepare=prep, step=f"        y = {call}  # SITE\n        self.out.copy_(y)")
    path, site = write_target(tmp_path / "target" / "lastguard.py", tpl, seed=random.randrange(2**31), d=4)
    bad = blocking(path, forget=mod)
    from site_util import marked_line
    want = marked_line(lib, "# GUARD" if shape == "guard" else "# SLICED")
    ddc = bad[bad.category == "data-dependent-control"]
    assert set(ddc.line) == {want}, table(bad)
    hit = at(bad, "data-dependent-control", want)
    assert (hit.caller_line == site).all(), table(bad)
