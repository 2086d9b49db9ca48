"""Python state another thread changes while the step runs is not the step's.

An asynchronous actor (IMPALA / sample-factory style) runs a loop on a thread started when the target was made:
it steps environments, fills a queue, bumps its own counters (`self.produced += 1`, a heartbeat time). The state
snapshot taken around an audited step sees those counters move, though nothing the step ran moved them and a
replay would not have to: the thread keeps running either way. A change whose every candidate statement sits in
a function that another live thread is running (one the step did not start: a thread the step starts is traced
as the step's, `audit/scan/patches/threads.py`) and in which the step ran no op is that thread's, and is no finding. What
the step takes from such a thread (`self.q.get()`) changes state in the step's own call, and stays one.
The threads are read when the rules run, right after the steps, while such a loop is still running.

State held under attributes the step's code never names is not the step's either, while another thread runs: a
torchdata pipeline (`Prefetcher`, a threaded `ParallelMapper`) kept as `self.it` and advanced only in prepare()
keeps filling its queues and snapshot store from its own threads during the step; the methods that write them
(`pop_version`, `get_initial_snapshot`) are also called by prepare()'s `next()`, so not every candidate statement
is the thread's. When no name on the changed object's path from the target (`it`, `root`, `_snapshot_store`) is
among those the step's code reaches by name, the step had no way to it.

Such a loop is seldom inside the function that changes the counter at the moment it is read: tensorboardX's
event logger thread waits in `queue.get` most of the time, and bumps `_num_outstanding_events` in
`_write_serialized_event`, which its `run` reaches through `write_event`. So a function counts as the other
thread's also when the functions on its stack reach it by name (followed through their files and the sites'),
provided the step's own code neither ran an op in it nor reaches it by name (`between_steps.step_names`).
"""

from __future__ import annotations

import sys
import threading
import types
from collections import deque

from audit.detectors.state import between_steps
from audit.detectors.source.name_reach import reached_from
from audit.scan.patches import module_hooks
from audit.scan.snapshot.own_dict import own_dict


def _started_in_step(t: threading.Thread) -> bool:
    """A thread whose run the scan wrapped to trace it (started inside an audited step)."""
    return hasattr(vars(t).get("run"), "__wrapped__")


def _codes_elsewhere() -> set:
    """The code objects of every frame on the stacks of the other live threads the step did not start."""
    me, threads = threading.get_ident(), {t.ident: t for t in threading.enumerate()}
    out = set()
    for tid, frame in sys._current_frames().items():
        t = threads.get(tid)
        if tid == me or t is None or _started_in_step(t):
            continue
        while frame is not None:
            out.add(frame.f_code)
            frame = frame.f_back
    return out


def running_elsewhere() -> set[tuple[str, str]]:
    """(file, function) of every frame on the stacks of the other live threads the step did not start."""
    return {(c.co_filename, c.co_name) for c in _codes_elsewhere()}


def reached_elsewhere(files: set) -> set[str]:
    """Names of the functions the other live threads' running functions reach by name (through their files and
    `files`), those functions included."""
    return reached_from(_codes_elsewhere(), files)


def thread_work_only(ctx, step: int, sites: list, ran: set) -> bool:
    """Whether every site is in a function another live thread reaches from what it is running, and which the
    step neither ran an op in nor reaches by name from its own code."""
    if not sites:
        return False
    files = {f for f, _, _ in sites}
    theirs, ours = reached_elsewhere(files), between_steps.step_names(ctx, step, files)
    return all(fn in theirs and fn not in ours and (f, fn) not in ran and not fn.startswith("__")
               for f, _, fn in sites)


def unnamed_holder(ctx, step: int, change, sites: list) -> bool:
    """Whether another live thread (one the step did not start) holds the changed object (from the locals of its
    frames) and no name on the path from the target to the changed attribute is among the names the step's code
    reaches (followed through its files, the sites' and the target's own), the module hooks torch ran included."""
    from audit.detectors.state.sites import object_at

    if change.owner.startswith("<") or not _held_elsewhere(object_at(ctx, change.owner)):
        return False
    path = [p for p in f"{change.owner}.{change.attr}".replace("[", ".").split(".") if p and not p[0].isdigit()]
    files = {f for f, _, _ in sites} | set(ctx.own_files())
    ours = between_steps.step_names(ctx, step, files) | reached_from(_hooks_run(ctx, step), files)
    return bool(path) and not set(path) & ours


def _held_elsewhere(obj, depth: int = 6, limit: int = 20000) -> bool:
    """Whether `obj` is reachable from the locals of another live thread's frames (one the step did not start), through
    attributes and containers, `depth` hops at most: a prefetch thread running `_populate_queue(source, q,
    snapshot_store)` holds the store it fills; a test runner's or a progress bar's thread holds none of the target."""
    if obj is None:
        return False
    me, threads = threading.get_ident(), {t.ident: t for t in threading.enumerate()}
    todo, seen = deque(), set()
    for tid, frame in sys._current_frames().items():
        t = threads.get(tid)
        while frame is not None and tid != me and t is not None and not _started_in_step(t):
            todo.extend((v, 0) for v in list(frame.f_locals.values()))
            frame = frame.f_back
    while todo and len(seen) < limit:
        v, d = todo.popleft()  # breadth first: the nearest holders before a large structure's depths
        if v is obj:
            return True
        if id(v) in seen or d >= depth or isinstance(v, (str, bytes, int, float, type, types.ModuleType)):
            continue
        seen.add(id(v))
        kids = list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, (list, tuple, deque)) \
            else list(d_.values()) if isinstance(d_ := own_dict(v), dict) else []
        todo.extend((k, d + 1) for k in kids[:256])
    return False


def _hooks_run(ctx, step: int) -> set:
    """The code of the module hooks torch ran in the step: called by torch, not by name, and often running no op."""
    calls = ctx.trace.hook_calls[step] if step < len(ctx.trace.hook_calls) else ()
    return {code for hooks, _, _ in calls for fn in map(module_hooks.function_of, hooks)
            if (code := getattr(fn, "__code__", None)) is not None}


def other_threads_only(sites: list, ran: set) -> bool:
    """Whether every site (file, line, function) is in a function another thread is running and the step's
    ops never ran in (`ran`: (file, function) pairs of the step's op stacks)."""
    if not sites:
        return False
    busy = running_elsewhere()
    return all((f, fn) in busy and (f, fn) not in ran for f, _, fn in sites)
