"""Python state another thread changes while the step runs is not the step's.

An asynchronous actor (IMPALA / sample-factory style) runs a loop on a thread started when the target was made:
it steps environments, fills a queue, bumps its own counters (`self.produced += 1`, a heartbeat time). The state
snapshot taken around an audited step sees those counters move, though nothing the step ran moved them and a
replay would not have to: the thread keeps running either way. A change whose every candidate statement sits in
a function that another live thread is running (one the step did not start: a thread the step starts is traced
as the step's, `audit/scan/threads.py`) and in which the step ran no op is that thread's, and is no finding. What
the step takes from such a thread (`self.q.get()`) changes state in the step's own call, and stays one.
The threads are read when the rules run, right after the steps, while such a loop is still running.
"""

from __future__ import annotations

import sys
import threading


def _started_in_step(t: threading.Thread) -> bool:
    """A thread whose run the scan wrapped to trace it (started inside an audited step)."""
    return hasattr(vars(t).get("run"), "__wrapped__")


def running_elsewhere() -> set[tuple[str, str]]:
    """(file, function) of every frame on the stacks of the other live threads the step did not start."""
    me, threads = threading.get_ident(), {t.ident: t for t in threading.enumerate()}
    out = set()
    for tid, frame in sys._current_frames().items():
        t = threads.get(tid)
        if tid == me or t is None or _started_in_step(t):
            continue
        while frame is not None:
            out.add((frame.f_code.co_filename, frame.f_code.co_name))
            frame = frame.f_back
    return out


def other_threads_only(sites: list, ran: set) -> bool:
    """Whether every site (file, line, function) is in a function another thread is running and the step's
    ops never ran in (`ran`: (file, function) pairs of the step's op stacks)."""
    if not sites:
        return False
    busy = running_elsewhere()
    return all((f, fn) in busy and (f, fn) not in ran for f, _, fn in sites)
