"""A multiprocessing queue's items leave it at once: what a step put there is counted, not read back.

`multiprocessing.Queue.put` appends to a buffer that a feeder thread drains into a pipe within microseconds, and
the consumer (tensorboardX's event logger thread, a detokenizer process) takes the item from the pipe: by the time
the state snapshot after a step looks, the buffer is empty or not depending on the threads' timing, and the pipe
cannot be read without taking from it. So a put in the step would be found in some runs and not in others, placed
at whichever statement of the library names the queue (its `close()`). While the audited steps run, the puts on
each such queue are counted (`counting_puts`), and the queue is compared by that count alone (`fingerprint`): a
replay never puts, so a step that put one item is one cpu-side-effect, at the call that put it.
"""

from __future__ import annotations

import contextlib
import multiprocessing.queues as mpq
import weakref

__all__ = ["PUTTERS", "counting_puts", "fingerprint", "is_mp_queue", "is_queue_fp", "shown"]

PUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # queue -> items put while a step ran
_CLASSES = (mpq.Queue, mpq.SimpleQueue)  # JoinableQueue is a Queue


def is_mp_queue(v) -> bool:
    return isinstance(v, _CLASSES)


def fingerprint(v) -> tuple:
    """What a step can change in a multiprocessing queue: the number of items it put. The queue's identity is
    kept, so that one queue reached under two names (the writer's `_event_queue`, its worker's `_queue`) is
    told apart from two queues."""
    return ("mpQueue", id(v), PUTS.get(v, 0))


def is_queue_fp(fp) -> bool:
    return isinstance(fp, tuple) and len(fp) == 3 and fp[0] == "mpQueue"


def shown(fp) -> str:
    return f"<multiprocessing queue, {fp[2]} put>"


PUTTERS = ("put", "put_nowait")  # the calls that change what the queue is compared by


def _counted(put):
    def put_counted(self, *args, **kwargs):
        out = put(self, *args, **kwargs)
        with contextlib.suppress(TypeError):
            PUTS[self] = PUTS.get(self, 0) + 1
        return out
    put_counted.__wrapped__ = put
    return put_counted


@contextlib.contextmanager
def counting_puts():
    """Count the puts on every multiprocessing queue while the block runs (an audited step)."""
    classes = (mpq.Queue, mpq.JoinableQueue, mpq.SimpleQueue)
    saved = [(c, c.__dict__["put"]) for c in classes if "put" in c.__dict__]
    for c, put in saved:
        c.put = _counted(put)
    try:
        yield
    finally:
        for c, put in saved:
            c.put = put
