"""data-dependent-control: a guard in a loop body that skips one iteration's work.

Logits processors switched on and off per request (`for p in procs: if p.enabled: x = p(x)`): one step
runs a processor's ops the other does not, and goes on with the next processor from the same body
line. The loop ran the same number of times in both steps; the `if` in its body decided, so that is
the statement named, not the `for`. (When the skipped processor is the last one, the ops cannot tell a
skipped iteration from a shorter loop; a guard testing the loop's element decides it,
test_audit_last_item_guard.py.)"""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

TARGET = """
import torch


class Proc:
    def __init__(self, fn):
        self.fn, self.enabled = fn, True

    def __call__(self, x):
        return self.fn(x)


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {d})
        self.procs = [Proc(lambda x: x.softmax(-1) * {k}), Proc(lambda x: x.clamp(-5.0, 5.0))]
        if {last}:
            self.procs.reverse()
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        self.procs[{which}].enabled = i % 2 == 0

    @torch.no_grad()
    def step(self):
        h = self.x @ self.w
        for p in self.procs:  # LOOP
            if p.enabled:  # SITE
                h = p(h)
        self.out.copy_(h)
        return self.out

def make(device):
    return Target()
"""


def test_the_guard_in_the_loop_body_is_named_not_the_loop(tmp_path):
    last = random.choice([True, False])
    path, site = write_target(tmp_path / "toggle_target.py", TARGET, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), k=random.choice([2.0, 3.0]), last=last, which=0)
    bad = blocking(path)
    ddc = bad[bad.category == "data-dependent-control"]
    assert set(ddc.line) == {site}, table(bad)
