"""A logger called under a branch the step takes now and then fills its private `_cache` of enabled levels the first
time: memoisation inside a standard-library object, info, while the counter and the branch stay findings. A
`queue.Queue` put under the same kind of branch changes the queue's public deque: state a consumer reads, kept."""

from __future__ import annotations

import random
import textwrap

import audit

SRC = textwrap.dedent('''
    import logging
    import queue
    import torch

    log = logging.getLogger("decode-PERIOD")

    class Step:
        def __init__(self):
            self.w = torch.randn(16, 32)
            self.x = torch.zeros(2, 16)
            self.n = 0
            self.out = queue.Queue()

        def prepare(self, i):
            self.x.copy_(torch.randn(2, 16))

        @torch.no_grad()
        def step(self):
            logits = self.x @ self.w
            self.n += 1  # counter
            if self.n % PERIOD == 0:  # branch
                log.debug("step %d", self.n)  # logged
                if USE_QUEUE:
                    self.out.put(self.n)  # queued
            return logits

    def make(device="cpu"):
        return Step()
''')


def _line(src, tag):
    return next(n for n, t in enumerate(src.splitlines(), 1) if t.rstrip().endswith(tag))


def _scan(tmp_path, use_queue: bool):
    # two plain warmup steps count n to 2, so with a period of 4 or 5 the first call falls in audited step 1 or 2
    period = random.choice((4, 5))
    src = SRC.replace("PERIOD", str(period)).replace("USE_QUEUE", str(use_queue))
    path = tmp_path / f"logged_{use_queue}.py"
    path.write_text(src)
    return src, audit.scan(f"{path}:make", device="cpu", steps=6, warmup=2).df


def test_a_loggers_first_cache_fill_is_info(tmp_path):
    src, df = _scan(tmp_path, use_queue=False)
    side = df[df.category == "cpu-side-effect"]
    logged = side[side.line.astype(int) == _line(src, "# logged")]
    assert not logged.empty and set(logged.severity) == {"info"}, side[["line", "severity", "message"]].to_string()
    blocking = side[side.severity != "info"]
    assert set(blocking.line.astype(int)) == {_line(src, "# counter")}, blocking[["line", "message"]].to_string()


def test_a_queue_put_under_the_branch_stays_a_finding(tmp_path):
    src, df = _scan(tmp_path, use_queue=True)
    side = df[(df.category == "cpu-side-effect") & (df.severity != "info")]
    assert _line(src, "# queued") in set(side.line.astype(int)), side[["line", "severity", "message"]].to_string()
