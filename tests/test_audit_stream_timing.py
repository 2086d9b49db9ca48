"""Event timing and record_stream in the step, as libraries write them, on a CPU scan.

`Event.elapsed_time` reads two events' device timestamps on the host: the device must have reached both,
and events recorded inside a capture have none. It is a host-sync at the reading line (in a library too,
with the target's call as caller); recording in the step and reading after it is fine.
`Tensor.record_stream(s)` is the allocator's bookkeeping: on a CPU scan, with stand-in streams, it must
not stop the step, so the stream rule still sees a side stream whose work is never joined.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, install_library, library_hit, library_target, matmul_target, table, write_target

OWN = matmul_target(
    init="        self.a = torch.cuda.Event(enable_timing=True)\n        self.b = torch.cuda.Event(enable_timing=True)"
    "\n        self.ms = []",
    step="""        self.a.record()
        self.out.copy_(torch.tanh(self.x @ self.w))
        self.b.record()
        {read}
        return self.out""",
    prepare="        {prep}")


READS = {"elapsed_time": "self.ms.append(self.a.elapsed_time(self.b))  # SITE",
         "synchronize": "self.b.synchronize()  # SITE",
         "query": "self.ms.append(self.b.query())  # SITE"}


def _own(tmp_path, in_step: bool, read: str = READS["elapsed_time"]):
    # the twin only records: the timing is read by whoever holds the events, after the step (a CPU-only
    # torch cannot read real events outside a scanned step)
    return write_target(tmp_path / "timing_target.py", OWN, seed=random.randrange(2**31), d=random.choice([4, 8, 16]),
                        read=read if in_step else "pass  # SITE", prep="pass")


@pytest.mark.parametrize("read", sorted(READS))
def test_a_read_of_events_made_in_make_is_one_host_read(tmp_path, read):
    path, site = _own(tmp_path, in_step=True, read=READS[read])
    bad = blocking(path)
    hit = at(bad, "host-sync", site)
    assert len(hit) == 1 and read in hit.iloc[0].op, table(bad)


def test_events_only_recorded_in_the_step_give_no_host_read(tmp_path):
    path, _ = _own(tmp_path, in_step=False)
    bad = blocking(path)
    assert not len(bad[bad.category == "host-sync"]), table(bad)


LIB = """
import torch

class Timer:
    def __init__(self):
        self.s = self.e = None

    def begin(self):
        if self.s is None:
            self.s, self.e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.s.record()

    def end(self):
        self.e.record()
        return self.s.elapsed_time(self.e)  # LIBSITE

_SIDE = []

def overlap(fn, x, join):
    if not _SIDE:
        _SIDE.append(torch.cuda.Stream())
    cur, s = torch.cuda.current_stream(), _SIDE[0]
    s.wait_stream(cur)
    with torch.cuda.stream(s):  # STREAMSITE
        y = fn(x)
    y.record_stream(cur)
    if join:
        cur.wait_stream(s)
    return y
"""


def test_a_library_timer_reading_elapsed_time_is_found_with_the_callers_line(tmp_path, monkeypatch):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="timing")
    tpl = matmul_target(imports=f"from {mod} import Timer", init="        self.t = Timer()",
                        step="""        self.t.begin()
        self.out.copy_(torch.tanh(self.x @ self.w))
        ms = self.t.end()  # SITE
        return self.out""")
    path, site = write_target(tmp_path / "target" / "lib_timer.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8]))
    library_hit(blocking(path, forget=mod), "host-sync", lib, path, site)


def _overlap(tmp_path, monkeypatch, join: bool):
    return library_target(tmp_path, monkeypatch, LIB, "overlap", "overlap",
                          f"overlap(lambda v: torch.tanh(v @ self.w), self.x, {join})", out="y * 2")


def test_record_stream_runs_on_a_cpu_scan_and_the_missing_join_is_found(tmp_path, monkeypatch):
    mod, lib, path, site = _overlap(tmp_path, monkeypatch, join=False)
    bad = blocking(path, forget=mod)
    library_hit(bad, "unjoined-stream", lib, path, site, marker="# STREAMSITE")


def test_record_stream_with_a_join_gives_no_finding(tmp_path, monkeypatch):
    mod, lib, path, site = _overlap(tmp_path, monkeypatch, join=True)
    bad = blocking(path, forget=mod)
    assert not len(bad), table(bad)
