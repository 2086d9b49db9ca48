"""Each (batch, context) group of a bench run in a process of its own, merged into one result.

Why: a graph replay's time depends on what ran before it in the process. On the H200 the flash-h200 full
row at context 16384 measured 7.82 ms/token in a process of its own, 8.74 after another context's rows had
been profiled (torch.profiler attaches CUPTI) and 8.16 after another context's eager, full and compile
rows alone. Within a group the modes still share one process, as the issue's comparisons ask: eager, full
and torch.compile measured in the same run on the same model. The workers are spawned (never forked: the
parent may hold a CUDA context) and load the model from the same preset and seed, so every group measures
the same weights. Rows, progress ticks and the result come back through a queue; a worker that dies leaves
its group's rows with the exit code in their notes, and the run goes on.
"""

from __future__ import annotations

import multiprocessing
import queue

from audit.bench.result import BenchResult, ModeResult

POLL_S = 5.0


def run_groups(bench, groups: list[tuple[int, int]], modes, kwargs: dict, progress=None,
               on_row=None) -> BenchResult | None:
    """bench(**kwargs) once per (batch, context) of groups, each in a spawned process (`bench`, a module-level
    function, travels by name); the results merged in order (BenchResult.merged). `progress` and `on_row` see
    every worker's ticks and rows as they come."""
    ctx = multiprocessing.get_context("spawn")
    done: BenchResult | None = None
    for i, (batch, context) in enumerate(groups):
        q = ctx.Queue()
        args = {**kwargs, "batches": (batch,), "contexts": [context], "isolate": False, "layer_profile": i == 0}
        worker = ctx.Process(target=_worker, args=(q, bench, args), daemon=True)
        worker.start()
        result = _collect(q, worker, done, progress, on_row)
        worker.join()
        if result is None:  # the worker died: its group is reported, not lost
            result = _failed(done, modes, batch, context, f"bench worker exited with code {worker.exitcode}")
        done = result if done is None else done.merged(result)
        if on_row:
            on_row(done)
    return done


def _collect(q, worker, before: BenchResult | None, progress, on_row) -> BenchResult | None:
    while True:
        try:
            kind, payload = q.get(timeout=POLL_S)
        except queue.Empty:
            if not worker.is_alive():
                return None
            continue
        if kind == "progress" and progress:
            progress()
        elif kind == "row" and on_row:
            part = BenchResult.from_json(payload)
            on_row(part if before is None else before.merged(part))
        elif kind == "done":
            return BenchResult.from_json(payload)
        elif kind == "error":
            from audit.errors import AuditError

            raise AuditError(payload)


def _failed(before: BenchResult | None, modes, batch: int, context: int, why: str) -> BenchResult:
    base = before or BenchResult("", "", 0, "", 0, None)
    out = BenchResult(base.preset, base.device, base.n_layers, base.dtype, base.steps, base.copy_tb_s, base.kernels)
    out.rows = [ModeResult(m, batch, context, note=f"failed: {why}") for m in modes]
    return out


def _worker(q, bench, kwargs: dict) -> None:  # pragma: no cover - runs in the spawned process
    from audit.errors import AuditError

    try:
        res = bench(**kwargs, progress=lambda: q.put(("progress", None)),
                    on_row=lambda r: q.put(("row", r.to_json())))
        q.put(("done", res.to_json()))
    except AuditError as e:
        q.put(("error", str(e)))
