"""GPU trial capture of one callable: does it capture, is every kernel in the graph, does replay match?

A trial answers three questions a person cannot see from eager runs:
1. Does `torch.cuda.graph` accept it? The CUDA error names no op, so the failure is classified
   from its text (`classify_error`) and later attributed to a module by bisection.
2. Is every kernel of an eager run a node of the graph? Kernels launched on another stream or
   device run eagerly during capture and are silently missing from the replay (docs/hazards.md), so we
   count the kernels of one profiled eager run and the kernel nodes of the captured graph.
3. Does replay compute what eager computes? Both start from the same snapshot of the program's
   state, get the same fresh inputs for several steps, and are compared bitwise, outputs and state.

`trial_capture` runs IN THIS PROCESS and a failed capture can leave the process broken for good
(an invalidated capture poisons the next random op). Only a disposable worker should call it: the
bisection goes through `audit.capture.pool`, which runs `audit.capture.worker` subprocesses.
Everything above the trial itself (classification, results) is plain Python and imports no CUDA.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from audit.capture.errors import ERROR_CLASSES, classify_error, error_text, first_line, raised_at

__all__ = ["ERROR_CLASSES", "STATUSES", "FAILING", "CaptureResult", "classify_error", "first_line", "error_text",
           "raised_at", "check_stream_device", "trial_capture", "capture_callable"]

# pass: captured, complete, replay == eager. fail: capture raised. empty: no kernel node although eager
# ran kernels. uncaptured: fewer kernel nodes than eager kernels. mismatch: replay != eager.
# not-called: the module did not run in the step. error: the eager run itself failed (no verdict).
STATUSES = ("pass", "fail", "empty", "uncaptured", "mismatch", "not-called", "error")
FAILING = frozenset({"fail", "empty", "uncaptured", "mismatch"})


@dataclass
class CaptureResult:
    """What one trial capture found; JSON-serializable (the worker sends it over a pipe)."""

    path: str = ""                       # module path from the target ("<step>" for the whole step)
    status: str = "pass"
    error_class: str | None = None
    error: str | None = None             # first line(s) of the error text
    phase: str | None = None             # where it stopped: record / warmup / eager / capture / replay / profile
    raised_at: dict | None = None        # innermost user frame of the exception: file, line, function
    raised_in: str | None = None         # innermost module running when it raised
    eager_kernels: int | None = None     # CUDA kernels of one profiled eager run
    eager_memops: int | None = None      # memcpy / memset of that run
    graph_nodes: int | None = None       # every node of the captured graph
    graph_kernels: int | None = None     # kernel nodes (child graphs included)
    node_types: dict = field(default_factory=dict)
    missing_at: dict | None = None       # first kernel missing from the graph and the line that launched it
    replay_steps: int = 0                # steps compared bitwise
    max_abs_diff: float | None = None
    first_diff: str | None = None        # "step 1: out[0]" or "step 1: state model.cache.kv"
    eager_spread: float | None = None    # two eager runs differ by this much (non-deterministic kernels)
    warnings: list = field(default_factory=list)
    module_type: str | None = None
    source: dict | None = None           # file, line, function of the captured method; ranges of its class
    children: list = field(default_factory=list)  # [{"path", "type", "called"}]
    device: str | None = None
    stream_device: str | None = None
    seconds: float = 0.0

    @property
    def failing(self) -> bool:
        return self.status in FAILING

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CaptureResult":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def describe(self) -> str:
        """One short line for a tree node or a finding message."""
        if self.status == "fail":
            return f"{self.error_class}: {first_line(self.error or '', 160)}"
        if self.status in ("empty", "uncaptured"):
            return f"graph has {self.graph_kernels} kernel nodes, eager ran {self.eager_kernels} kernels"
        if self.status == "mismatch":
            return f"replay differs at {self.first_diff} (max abs diff {_fmt(self.max_abs_diff)})"
        if self.status == "error":
            return f"{self.phase} failed: {first_line(self.error or '', 160)}"
        if self.status == "not-called":
            return "did not run in the step"
        k = f"{self.graph_kernels} kernels" if self.graph_kernels is not None else "captured"
        return f"{k}, replay == eager over {self.replay_steps} steps"


def _fmt(x) -> str:
    return "?" if x is None else f"{x:.3g}"


def _fail(res: CaptureResult, status: str, phase: str, exc: BaseException) -> CaptureResult:
    text = error_text(exc)
    res.status, res.phase, res.error = status, phase, text[:2000]
    res.error_class = classify_error(text)
    res.raised_at = raised_at(exc)
    return res


# ---------------------------------------------------------------------- device checks
def check_stream_device(stream, device) -> str | None:
    """A warning when the capture stream lives on another device than the captured work.

    With torch.cuda.set_device alone, graphs come out empty (device 0) or replay stale data on
    other devices: the stream must be created for the module's device inside torch.cuda.device(dev).
    """
    import torch

    dev = torch.device(device)
    sdev = getattr(stream, "device", None)
    if sdev is None or dev.type != "cuda":
        return None
    sdev = torch.device(sdev)
    if dev.index is not None and sdev.index != dev.index:
        return (f"capture stream is on {sdev} but the captured work runs on {dev}: the graph records "
                f"nothing from {dev}; create the stream with torch.cuda.Stream(device={str(dev)!r}) "
                f"inside torch.cuda.device({str(dev)!r})")
    return None


# ---------------------------------------------------------------------- the trial
def trial_capture(fn: Callable[[], Any], *, device, feed: Callable[[int], None] | None = None,
                  state: tuple = (), stream=None, capture_error_mode: str = "global", warmup: int = 2,
                  steps: int = 3, count_kernels: bool = True, label: str = "",
                  annotate: Callable[[BaseException, CaptureResult], None] | None = None) -> CaptureResult:
    """Warm up, capture, replay against eager, count kernels. Call only in a disposable process.

    fn: the region to capture (takes no arguments: its inputs are static buffers);
    feed(k): stages fresh inputs for step k outside the graph (copy_ into the static buffers);
    state: objects whose tensors/attributes fn reads and mutates: snapshotted after warmup and
    restored before eager, capture and replay, so every phase starts from the same program state.
    """
    import torch

    from audit.capture.graph import count_eager_kernels, graph_kernel_counts
    from audit.capture.state import Snapshot

    res = CaptureResult(path=label, device=str(device))
    t0 = time.perf_counter()
    feed = feed or (lambda k: None)
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        res.status, res.phase, res.error = "error", "setup", f"trial capture needs a CUDA device, got {dev}"
        return res
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if capture_error_mode not in ("global", "thread_local", "relaxed"):
        raise ValueError(f"capture_error_mode must be global, thread_local or relaxed, not {capture_error_mode!r}")
    warmup = max(2, warmup)
    with torch.cuda.device(dev):
        s = stream if stream is not None else torch.cuda.Stream(device=dev)
        res.stream_device = str(s.device)
        w = check_stream_device(s, dev)
        if w:
            res.warnings.append(w)
            warnings.warn(w, RuntimeWarning, stacklevel=2)

        def sync() -> None:  # the module's device and the stream's (they differ in the wrong-device case)
            torch.cuda.synchronize(dev)
            torch.cuda.synchronize(s.device)

        sync()
        # Every phase runs on the capture stream: restores, inputs, eager runs and replays stay ordered.
        with torch.cuda.stream(s):
            phase = "warmup"
            try:
                for k in range(warmup):
                    feed(k)
                    fn()
                sync()
                snap = Snapshot(state)
                phase = "eager"
                ref = _run_eager(fn, feed, snap, steps, sync)
                ref2 = _run_eager(fn, feed, snap, steps, sync)
                res.eager_spread = _spread(ref, ref2, snap)
                snap.restore()
                feed(0)
                sync()
            except Exception as e:
                return _timed(_fail(res, "error", phase, e), t0)

            # ---- capture: the only phase that may poison the process
            g = torch.cuda.CUDAGraph(keep_graph=True)
            with warnings.catch_warnings(record=True) as wlog:
                warnings.simplefilter("always")
                try:
                    with torch.cuda.graph(g, stream=s, capture_error_mode=capture_error_mode):
                        static_out = fn()
                except Exception as e:  # every capture error is a verdict
                    _fail(res, "fail", "capture", e)
                    if annotate is not None:
                        annotate(e, res)
                    return _timed(res, t0)
            empty_warned = False
            for m in wlog:
                msg = str(m.message)
                empty_warned = empty_warned or "CUDA Graph is empty" in msg
                if "graph" in msg.lower() or "captur" in msg.lower():
                    res.warnings.append(first_line(msg))
            try:
                counts = graph_kernel_counts(g.raw_cuda_graph())
                res.graph_nodes, res.graph_kernels, res.node_types = counts["nodes"], counts["kernels"], counts["types"]
            except Exception as e:  # no cuda bindings, or an API change: say so, keep going
                res.warnings.append(f"graph nodes not counted: {first_line(str(e))}")

            # ---- one profiled eager run (kernels on any stream), then replay against eager
            phase = "profile"
            try:
                if count_kernels:
                    snap.restore()
                    feed(0)
                    res.eager_kernels, res.eager_memops = count_eager_kernels(fn, sync)
                if count_kernels and res.graph_kernels is not None and res.eager_kernels:
                    phase = "profile stacks"
                    res.missing_at = _first_missing(fn, feed, snap, sync, res.eager_kernels - res.graph_kernels)
                phase = "replay"
                snap.restore()
                diff = _run_replay(g, static_out, feed, snap, ref, steps, sync)
                res.replay_steps = steps
                if diff is not None:
                    res.max_abs_diff, res.first_diff = diff
                snap.restore()
                sync()
            except Exception as e:
                if phase == "replay" and res.graph_kernels == 0 and res.eager_kernels:
                    res.warnings.append(f"replay of the empty graph failed: {first_line(error_text(e))}")
                    _verdict(res, empty_warned)
                    return _timed(res, t0)
                return _timed(_fail(res, "error", phase, e), t0)
            del g
    _verdict(res, empty_warned)
    return _timed(res, t0)


def _first_missing(fn, feed, snap, sync, missing: int) -> dict | None:
    """One more eager run, profiled with stacks, when the graph lacks kernels (never fails the trial)."""
    from audit.capture.missing import first_missing_kernel

    if missing <= 0:
        return None
    snap.restore()
    feed(0)
    try:
        return first_missing_kernel(fn, sync, missing)
    except Exception as e:  # noqa: BLE001 - the line is a bonus; the counts stand without it
        return {"error": first_line(str(e))}


def _verdict(res: CaptureResult, empty_warned: bool) -> None:
    """Status from the counts and the comparison: missing kernels first (they explain mismatches)."""
    ek, gk = res.eager_kernels, res.graph_kernels
    if ek and (gk == 0 or (gk is None and empty_warned)):
        res.status = "empty"
    elif ek is not None and gk is not None and gk < ek:
        res.status = "uncaptured"
    elif res.first_diff is not None and not _within_spread(res):
        res.status = "mismatch"
    else:
        res.status = "pass"
        if res.first_diff is not None:
            res.warnings.append(f"eager is not deterministic (two eager runs differ by {_fmt(res.eager_spread)}); "
                                f"replay differs by {_fmt(res.max_abs_diff)}, within that spread")
    if empty_warned and res.status == "pass":
        res.warnings.append("torch warned that the graph is empty (the step launched no kernel)")


def _within_spread(res: CaptureResult) -> bool:
    """Non-deterministic kernels (atomics) make eager differ from itself: tolerate that much, no more."""
    return (res.eager_spread is not None and res.max_abs_diff is not None
            and res.max_abs_diff <= res.eager_spread and res.max_abs_diff != float("inf"))


def _timed(res: CaptureResult, t0: float) -> CaptureResult:
    res.seconds = round(time.perf_counter() - t0, 3)
    return res


def _run_eager(fn, feed, snap, steps: int, sync) -> list:
    """[(outputs, changed state)] per step, eager, from the snapshot (on the current = capture stream)."""
    from audit.capture.state import clone_tree

    snap.restore()
    out = []
    for k in range(steps):
        feed(k)
        o = clone_tree(fn())
        sync()
        out.append((o, snap.changed()))
    return out


def _run_replay(g, static_out, feed, snap, ref, steps: int, sync):
    """(max abs diff, first place) of replay against the eager record, or None when bitwise equal."""
    from audit.capture.state import compare_trees

    worst, where = 0.0, None
    for k in range(steps):
        feed(k)
        g.replay()
        sync()
        d = compare_trees(ref[k][0], static_out, "out")
        if d is None:
            d = snap.compare_state(ref[k][1])
        if d is not None:
            worst = max(worst, d[0])
            if where is None:
                where = f"step {k}: {d[1]}"
    return None if where is None else (worst, where)


def _spread(ref, ref2, snap) -> float | None:
    """How far two eager runs from the same state and inputs differ (None: bitwise equal)."""
    from audit.capture.state import compare_trees, compare_changed

    worst = None
    for (o1, c1), (o2, c2) in zip(ref, ref2):
        for d in (compare_trees(o1, o2, "out"), compare_changed(c1, c2, snap)):
            if d is not None:
                worst = max(worst or 0.0, d[0])
    return worst


def capture_callable(fn: Callable, args: tuple = (), kwargs: dict | None = None, *, device=None,
                     seed: int = 0, **options) -> CaptureResult:
    """In-process trial of fn(*args, **kwargs) with the args cloned into static buffers and filled
    with fresh random values each step. Same caveat as trial_capture: a disposable process only."""
    import torch

    from audit.capture.state import RandomFeed, clone_tree

    static = clone_tree((tuple(args), dict(kwargs or {})))
    if device is None:
        dev = next((t.device for t in _tensors(static) if t.is_cuda), None)
        device = dev or torch.device("cuda", torch.cuda.current_device())
    feed = RandomFeed(static, seed=seed)
    owner = getattr(fn, "__self__", None)
    state = (static,) + ((fn,) if isinstance(fn, torch.nn.Module) else ()) + ((owner,) if owner is not None else ())
    return trial_capture(lambda: fn(*static[0], **static[1]), device=device, feed=feed, state=state,
                         label=getattr(fn, "__qualname__", type(fn).__name__), **options)


def _tensors(tree) -> list:
    from audit.capture.state import tensor_leaves

    return tensor_leaves(tree)
