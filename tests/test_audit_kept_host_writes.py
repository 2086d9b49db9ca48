"""baked-host-value: Python values written into a host buffer the target keeps are not baked into a graph.

A serving engine's slot mapping refilled in the step through a pinned staging buffer (`self.slot_cpu[b] =
blk * BS + off`, then `self.slot_dev.copy_(self.slot_cpu, non_blocking=True)`) lifts each Python int into a
host tensor and copies it into the buffer. A replay's memcpy reads the buffer's memory, whatever it holds then:
the write a replay skips is the cpu-side-effect at that line, not a value frozen into a kernel. The same values
written straight into a device buffer are still baked there. Sizes, names and the pinning spelling are drawn
fresh."""

from __future__ import annotations

import random

from site_util import at, blocking, table, write_target

TARGET = """
import torch


class Runner:
    def __init__(self, device):
        self.{staging} = torch.zeros({b}, dtype=torch.long, {pin})
        self.{dev} = torch.zeros({b}, dtype=torch.long, device=device)
        self.cache = torch.zeros({nb} * {bs}, {d}, device=device)
        self.x = torch.zeros({b}, {d}, device=device)
        self.lens = [{start} + j for j in range({b})]

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {d}))

    @torch.no_grad()
    def step(self):
        for j in range({b}):
            n = self.lens[j]
            {write} = (j * {per} + n // {bs}) * {bs} + n % {bs}  # SITE
            self.lens[j] = n + 1
        {send}
        self.cache.index_copy_(0, self.{dev}, self.x * 2.0)
        return self.cache.sum()


def make(device):
    return Runner(device)
"""


def _target(tmp_path, into_device: bool):
    b, bs, d = random.choice([2, 3]), random.choice([2, 4]), random.choice([4, 8])
    staging, dev = random.choice([("slot_cpu", "slot_dev"), ("slots_host", "slots"), ("mapping_pinned", "mapping")])
    pin = random.choice(["pin_memory=True", "pin_memory=torch.cuda.is_available()"])
    write = f"self.{dev}[j]" if into_device else f"self.{staging}[j]"
    send = "pass" if into_device else f"self.{dev}.copy_(self.{staging}, non_blocking=True)"
    return write_target(tmp_path / "kept_writes.py", TARGET, staging=staging, dev=dev, pin=pin, b=b, bs=bs, d=d,
                        nb=b * 8, per=8, start=random.randrange(0, 3), write=write, send=send)


def test_staging_refill_is_no_baked_value(tmp_path):
    path, site = _target(tmp_path, into_device=False)
    bad = blocking(path)
    assert not len(at(bad, "baked-host-value", site)), table(bad)
    assert len(at(bad, "cpu-side-effect", site)) == 1, table(bad)


def test_device_buffer_write_stays_baked(tmp_path):
    path, site = _target(tmp_path, into_device=True)
    bad = blocking(path)
    assert len(at(bad, "baked-host-value", site)) == 1, table(bad)
