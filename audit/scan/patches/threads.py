"""Work the step hands to another thread is the step's work too.

A dispatch mode is per thread: ops a step runs through an output thread (`pool.submit(detok, ids)`
waited on with `.result()`, a `threading.Thread` joined before returning) would not be traced, and a
`torch.nonzero` there would go unseen, though on a GPU it waits for the device all the same. During an
audited step, functions handed to a ThreadPoolExecutor and threads started run under the tracer's mode, and
remember the step's stack where they were handed over (`handed_from`): what they run is placed below that line.
The step's thread may be anywhere while the worker runs (a grammar bitmask filled while the forward runs, waited
on later), so where it is at that moment would change from step to step; where it handed the work over does not.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import itertools
import sys
import threading

from audit.scan.patches import mp_queues

__all__ = ["PerThread", "handed_from", "handed_task", "scheduling_state", "traced_threads"]

_LOCAL = threading.local()


class PerThread:
    """An attribute each thread keeps its own value of (the tracer's host-read depth).

    Work handed to a pool runs while other workers and the step's thread run: one worker inside a host
    read (`int(row.sum())`) must not mute the ops and reads another worker dispatches at that moment, or
    which of them the trace keeps would change with scheduling from step to step."""

    def __init__(self, default=0):
        self.default = default

    def __set_name__(self, owner, name):
        self.slot = f"_per_thread_{name}"

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        try:
            return obj.__dict__[self.slot].value
        except (KeyError, AttributeError):
            return self.default

    def __set__(self, obj, value):
        local = obj.__dict__.get(self.slot)
        if local is None:
            local = obj.__dict__.setdefault(self.slot, threading.local())
        local.value = value


def handed_task() -> int:
    """Which hand-over of the step (1, 2, ... in the order the step made them) the work this thread runs is,
    or 0. Which pool worker runs which task is scheduling; the step's order of hand-overs is not, so records
    are told apart and aligned across steps by this number, not by the worker's thread."""
    return getattr(_LOCAL, "task", 0)


def handed_from() -> tuple:
    """The step's stack where the work this thread runs was handed over (submit, start), or ()."""
    return getattr(_LOCAL, "origin", ())


@contextlib.contextmanager
def traced_threads(enter, stack_of=lambda frame: ()):
    """enter(): a context manager tracing the thread that enters it (the tracer's dispatch mode);
    stack_of(frame): the tracer's stack of the frame that hands work over."""
    submit, start = concurrent.futures.ThreadPoolExecutor.submit, threading.Thread.start

    handed = itertools.count(1)

    def wrap(fn, origin: tuple):
        task = next(handed)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            before = handed_from(), handed_task()
            _LOCAL.origin, _LOCAL.task = origin, task
            try:
                with enter():
                    return fn(*args, **kwargs)
            finally:
                _LOCAL.origin, _LOCAL.task = before
        return run

    def submit_traced(self, fn, /, *args, **kwargs):
        return submit(self, wrap(fn, stack_of(sys._getframe(1))), *args, **kwargs)

    def start_traced(self):
        self.run = wrap(self.run, stack_of(sys._getframe(1)))
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
