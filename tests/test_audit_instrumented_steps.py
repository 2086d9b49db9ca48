"""Instrumentation left in a decode step (timing, profiler schedules, annotations): what is host work a
replay skips and what is no hazard at all. Each target is written fresh with drawn names and sizes."""

from __future__ import annotations

import random
import textwrap

import audit


def _scan(tmp_path, src: str, name: str):
    f = tmp_path / f"{name}.py"
    f.write_text(src)
    inv = audit.scan(f"{f}:make", device="cpu", steps=3, warmup=1)
    return [r for r in inv.df.to_dict("records") if r["severity"] != "info"], f


def _line(path, marker: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if marker in ln)


def test_clock_accumulated_into_a_keyed_store_is_no_baked_value(tmp_path):
    """`self.times[j] += perf_counter() - t0`: the clock reaches a host dict, not the device. Its subscript's
    base and index are not names the statement binds, so `self` (read by every later line) is not clock data."""
    n, d = random.randint(2, 4), random.choice([8, 16, 24])
    src = textwrap.dedent(f'''
        import time
        import torch
        import torch.nn as nn


        class Step:
            def __init__(self, device):
                self.layers = nn.ModuleList(nn.Linear({d}, {d}) for _ in range({n})).to(device)
                self.x = torch.randn(2, {d}, device=device)
                self.spent = {{}}

            def prepare(self, i):
                self.x.fill_(0.1 * i)

            def step(self):
                h = self.x
                for j, layer in enumerate(self.layers):
                    t0 = time.perf_counter()
                    h = layer(h)
                    self.spent[j] = self.spent.get(j, 0.0) + (time.perf_counter() - t0)  # ACCUM
                return self.x * 2 + h


        def make(device):
            return Step(device)
    ''')
    found, f = _scan(tmp_path, src, f"timed_{random.randint(0, 9999)}")
    line = _line(f, "# ACCUM")
    assert not [r for r in found if r["category"] == "baked-host-value"], found
    assert [r for r in found if r["category"] == "cpu-side-effect" and r["line"] == line], found


_PROFILED = '''
import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule


class Step:
    def __init__(self, device):
        self.lin = nn.Linear({d}, {d}).to(device)
        self.x = torch.randn(2, {d}, device=device)
        self.pos = 0
        self.{prof} = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait={wait}, warmup=1, active=1))
        self.{prof}.start()

    def prepare(self, i):
        self.x.fill_(0.1 * i)
        self.pos = i

    def step(self):
        with record_function(f"decode pos={{self.pos}}"):  # LABEL
            y = self.lin(self.x)
        self.{prof}.step()  # SCHEDULE
        return y


def make(device):
    return Step(device)
'''


def test_profiler_labels_are_no_kernel_arguments_and_its_schedule_is_step_state(tmp_path):
    """record_function labels that change per step (the profiler's own `ProfilerStep#N`, a user's f-string) are
    host annotations: no baked value. The profiler's schedule counter, advanced by `prof.step()` in the step, is
    host state a replay never advances: cpu-side-effect at the call into the profiler."""
    prof = random.choice(["prof", "profiler", "_p"])
    src = _PROFILED.format(d=random.choice([8, 16]), prof=prof, wait=random.randint(50, 200))
    found, f = _scan(tmp_path, src, f"profiled_{random.randint(0, 9999)}")
    assert not [r for r in found if r["category"] == "baked-host-value"], found
    line = _line(f, "# SCHEDULE")
    hits = [r for r in found if r["category"] == "cpu-side-effect" and r["line"] == line]
    assert hits and "step_num" in hits[0]["message"], found


def test_emit_nvtx_in_the_step_is_its_synchronize(tmp_path):
    """`with torch.autograd.profiler.emit_nvtx():` synchronizes the device on entry and exit (inside torch), then
    emits NVTX ranges that launch nothing. A CPU scan reports the wait at the `with` line instead of stopping on
    the NVTX profiler a CPU-only torch refuses; a disabled one (`enabled=False`) waits for nothing."""
    d, flag = random.choice([8, 16, 32]), random.choice(["record_shapes=True", ""])
    src = textwrap.dedent(f'''
        import torch
        import torch.nn as nn
        from torch.autograd import profiler


        class Step:
            def __init__(self, device):
                self.lin = nn.Linear({d}, {d}).to(device)
                self.x = torch.randn(2, {d}, device=device)

            def prepare(self, i):
                self.x.fill_(0.1 * i)

            def step(self):
                with profiler.emit_nvtx({flag}):  # EMIT
                    y = self.lin(self.x)
                with profiler.emit_nvtx(enabled=False):
                    y = y * 2
                torch.cuda.nvtx.range_push("out")
                torch.cuda.nvtx.range_pop()
                return y


        def make(device):
            return Step(device)
    ''')
    found, f = _scan(tmp_path, src, f"emit_{random.randint(0, 9999)}")
    assert [(r["category"], r["line"]) for r in found] == [("host-sync", _line(f, "# EMIT"))], found
