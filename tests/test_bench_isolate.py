"""A bench run's (batch, context) groups each in a spawned process (audit/bench/isolate.py), merged into one result."""

from __future__ import annotations

import random


def test_each_group_is_measured_in_a_process_of_its_own(monkeypatch):
    """With isolate on, the parent measures nothing itself (its _measure raises here) and still gets every
    row of every group, in order, with each worker's progress ticks and its rows reported as they land."""
    from audit.bench import run as bench_run

    def refuse(*a, **k):
        raise AssertionError("the parent process measured a row")

    monkeypatch.setattr(bench_run, "_measure", refuse)
    contexts = sorted(random.sample(range(16, 60), 2))
    ticks, seen = [], []
    res = bench_run.bench("tiny", modes=("eager",), steps=2, batches=(1, 2), contexts=contexts, device="cpu",
                          isolate=True, progress=lambda: ticks.append(1), on_row=lambda r: seen.append(len(r.rows)))
    assert [(r.batch, r.context) for r in res.rows] == [(b, c) for c in contexts for b in (1, 2)]
    assert all(r.ms_median and r.ms_median > 0 for r in res.rows)
    assert len(ticks) == 4 and seen[-1] == 4 and seen == sorted(seen)
    assert res.per_layer == [] and res.preset == "tiny" and set(res.weight_bytes) == {"1", "2"}


def test_a_worker_that_dies_leaves_its_rows_with_the_reason():
    from audit.bench.isolate import _failed
    from audit.bench.result import BenchResult

    before = BenchResult("tiny", "cpu", 4, "float32", 2, None)
    out = _failed(before, ("eager", "full"), 16, 1024, "bench worker exited with code -9")
    assert [(r.mode, r.batch, r.context) for r in out.rows] == [("eager", 16, 1024), ("full", 16, 1024)]
    assert all("exited with code -9" in r.note for r in out.rows) and out.preset == "tiny"
