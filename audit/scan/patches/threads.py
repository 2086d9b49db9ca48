"""Work the step hands to another thread is the step's work too.

A dispatch mode is per thread: ops a step runs through an output thread (`pool.submit(detok, ids)`
waited on with `.result()`, a `threading.Thread` joined before returning) would not be traced, and a
`torch.nonzero` there would go unseen, though on a GPU it waits for the device all the same. During an
audited step, functions handed to a ThreadPoolExecutor and threads started run under the tracer's mode.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import threading

from audit.scan.patches import mp_queues

__all__ = ["scheduling_state", "traced_threads"]


@contextlib.contextmanager
def traced_threads(enter):
    """enter(): a context manager tracing the thread that enters it (the tracer's dispatch mode)."""
    submit, start = concurrent.futures.ThreadPoolExecutor.submit, threading.Thread.start

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with enter():
                return fn(*args, **kwargs)
        return run

    def submit_traced(self, fn, /, *args, **kwargs):
        return submit(self, wrap(fn), *args, **kwargs)

    def start_traced(self):
        self.run = wrap(self.run)
        return start(self)

    concurrent.futures.ThreadPoolExecutor.submit = submit_traced
    threading.Thread.start = start_traced
    try:
        with mp_queues.counting_puts():  # items handed to a feeder thread: counted, not read back
            yield
    finally:
        concurrent.futures.ThreadPoolExecutor.submit = submit
        threading.Thread.start = start


def scheduling_state(obj, attr: str) -> bool:
    """Whether `obj.attr` records which threads wait on a condition (`threading.Condition._waiters`, held
    inside every Event, Semaphore, Barrier and queue.Queue): it changes as other threads are scheduled,
    not with what the step computes, so it is no state a replay must repeat (the queue's items are)."""
    return attr == "_waiters" and isinstance(obj, threading.Condition)
