"""The host clock read in the step: a value that reaches device work, or decides a branch around it, is frozen
at capture even when it does not change during the scan (a time limit that has not expired yet). Timing kept
for metrics is not a finding. Limits, shapes and import spellings are drawn fresh each run."""

from __future__ import annotations

import random
import textwrap

import audit

_LIB = textwrap.dedent('''
    import time
    from time import monotonic as {mono}
    import datetime as dt

    import torch


    class TimeLimit:
        def __init__(self, limit):
            self.start, self.limit = time.time(), limit

        def __call__(self, n, device):
            elapsed = time.time() - self.start  # limit read
            is_done = elapsed > self.limit
            return torch.full((n,), is_done, device=device)


    def maybe_refine(x, deadline):
        if {mono}() < deadline:  # deadline read
            x = x * 2 + 1
        return x


    def anneal(x, t0):
        scale = 1.0 + 0.0 * (dt.datetime.now() - t0).total_seconds()  # anneal read
        return x * scale


    class Timed:
        def __init__(self):
            self.latency = []

        def __call__(self, fn, *args):
            t0 = time.perf_counter()
            out = fn(*args)
            self.latency.append(time.perf_counter() - t0)
            return out
''')

_TARGET = textwrap.dedent('''
    import datetime as dt
    import time

    import torch
    from {lib} import TimeLimit, Timed, anneal, maybe_refine


    class Step:
        def __init__(self, device):
            self.device = device
            self.x = torch.randn({n}, 8, device=device)
            self.limit = TimeLimit({limit})
            self.timed = Timed()
            self.deadline = time.monotonic() + {limit}
            self.t0 = dt.datetime.now()

        def prepare(self, i):
            self.x.copy_(torch.randn({n}, 8))

        @torch.no_grad()
        def step(self):
            done = self.limit({n}, self.device)  # call limit
            y = maybe_refine(self.x, self.deadline)  # call deadline
            y = anneal(y, self.t0)  # call anneal
            return self.timed(torch.matmul, y, y.T), done  # call timed

    def make(device):
        return Step(device)
''')


def test_clock_values_reaching_device_work_are_found_at_the_library_read(tmp_path, monkeypatch):
    lib = f"clocklib_{random.randrange(10**6)}"
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / f"{lib}.py").write_text(_LIB.format(mono=random.choice(["monotonic", "mono_clock"])))
    (tmp_path / "t").mkdir()
    target = tmp_path / "t" / "step.py"
    n = random.randint(2, 6)
    target.write_text(_TARGET.format(lib=lib, n=n, limit=random.uniform(3600, 7200)))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    inv = audit.scan(f"{target}:make", device="cpu", steps=4)
    rows = inv.df[inv.df.op == "host clock"]
    lib_src = (tmp_path / "site" / f"{lib}.py").read_text().splitlines()
    own = target.read_text().splitlines()
    got = {(lib_src[int(r.line) - 1].split("# ")[-1], r.category, r.severity,
            own[int(r.caller_line) - 1].split("# ")[-1]) for r in rows.itertuples()}
    assert got == {("limit read", "baked-host-value", "silent-corruption", "call limit"),
                   ("deadline read", "data-dependent-control", "silent-corruption", "call deadline"),
                   ("anneal read", "baked-host-value", "silent-corruption", "call anneal")}, \
        rows[["file", "line", "category", "caller_line"]].to_string()
    assert rows.file.astype(str).str.endswith(f"{lib}.py").all()
