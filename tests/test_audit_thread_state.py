"""A step that feeds a worker thread (`self.q.put(y)`, a detokenizer or logger draining the queue) changes the
queue's items, which a replay would not: one cpu-side-effect at the put line. Which threads wait on the
queue's condition (`Condition._waiters`) changes with scheduling, not with the step, and is no finding of
its own: before, a queue put came with a second finding with no source line, and a consumer polling with a
timeout made one on a step that never touched its queue. An Event the step sets is still found.
"""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

TEMPLATE = """
import queue
import threading
import time

import torch


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g)
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})
        self.q = queue.Queue()
        self.done = threading.Event()
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self):  # a consumer polling with a timeout (a streamer's iterator): it waits and wakes all the time
        while True:
            try:
                self.q.get(timeout=0.0005)
            except queue.Empty:
                pass

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        self.done.clear()
        time.sleep(0.002)

    def step(self):
        y = self.x @ self.w
        {hand}  # SITE
        self.out.copy_(y)
        return self.out


def make(device):
    return Target()
"""


def _scan(tmp_path, hand: str):
    path, site = write_target(tmp_path / "thread_state.py", TEMPLATE, hand=hand, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    return blocking(path), site


def test_a_queue_fed_worker_is_one_finding_at_the_put(tmp_path):
    bad, site = _scan(tmp_path, "self.q.put(y.clone())")
    assert list(zip(bad.category, bad.line)) == [("cpu-side-effect", site)], table(bad)
    assert "`q." in bad.iloc[0].message


def test_an_event_the_step_sets_is_still_found(tmp_path):
    bad, site = _scan(tmp_path, "self.done.set()")
    assert ("cpu-side-effect", site) in set(zip(bad.category, bad.line)), table(bad)
    assert not (bad.file == "<python state>").any(), table(bad)


def test_a_worker_polling_an_untouched_queue_is_clean(tmp_path):
    bad, _ = _scan(tmp_path, "y = y * 1.0")
    assert not len(bad), table(bad)
