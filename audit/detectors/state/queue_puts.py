"""Where a step put an item on a multiprocessing queue: the put call the step's code reaches.

A multiprocessing queue is compared by the number of items put on it while the step ran
(`audit/scan/patches/mp_queues.py`): only a `put` / `put_nowait` changes that. The statements that name the queue
otherwise (its `close()`, `self._event_queue = None` on shutdown, a consumer's `get`) or that put on it from
code the step never reaches (a worker's `stop()` putting its shutdown signal) are not the step's. The site is a
put call on the attribute (or global) holding the queue, in a function that ran torch ops in the step or that
the step's code reaches by name (tensorboardX's `add_event`, called from `add_scalar`); none found, no site
(the same queue reached under another name is reported once, at the name whose put the step reached).
"""

from __future__ import annotations

from audit.detectors.state import between_steps, library_callers
from audit.detectors.source import mutations
from audit.scan.patches.mp_queues import PUTTERS


def sites(ctx, change, step: int, files: list) -> list:
    """(file, line, function) of the puts on the changed queue that the step ran or reaches by name."""
    attr = change.attr.split(".")[-1]
    glob = change.owner.startswith("<module ") and "." not in change.attr
    ran = library_callers.executed(ctx, step)
    paths = sorted({f for f, _, _ in files if f})
    reached = between_steps.step_names(ctx, step, set(paths))
    out = [(f, line, fn) for f in paths for line, fn, m in mutations.method_calls(f, attr, global_name=glob)
           if m in PUTTERS and ((f, fn) in ran or fn in reached)]
    return sorted(set(out))[:3]
