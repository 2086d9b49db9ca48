"""CUDA scans: the waits sync-debug mode and the CUDA runtime report, on synthetic traces (audit/detectors/runtime_syncs.py).

A reported wait is a finding only on a line no other rule explains (a nonzero's line is the nonzero's), and a line
keeps one finding, under the op sync-debug mode named, whatever else the runtime reported there.
"""

from __future__ import annotations

import torch

from audit import detectors
from audit.report.inventory import Inventory
from audit.scan.records import OpRecord, Trace
from test_audit_engine import _meta, _record


def test_runtime_reported_syncs_only_where_nothing_else_explains_them():
    code = _record.__code__
    mm = _record("aten.mm", [_meta([4], "cuda:0")], [_meta([4], "cuda:0", sid=9)])
    nz = _record("aten.nonzero", [_meta([4], "cuda:0", sid=10)], [_meta([2, 1], "cuda:0", sid=11)])
    cb1 = OpRecord(0, 2, "sync", "cuda stream synchronization", (), stack=((code, 21),), note="gpu_trace")
    cb2 = OpRecord(0, 3, "sync", "cuda stream synchronization", (), stack=((code, 22),), note="gpu_trace")
    cb0 = OpRecord(0, 1, "sync", "cuda stream synchronization", (), stack=((code, 20),), note="gpu_trace")  # mm's too
    # the warning reaches Python as mm's C++ call returns: just after mm's record, on mm's line
    warn = OpRecord(0, 1, "sync", "sync-debug", (), stack=((code, 20),),
                    note="sync-debug\x00after\x00called a synchronizing CUDA operation")
    mm.index, mm.stack, nz.index, nz.stack = 0, ((code, 20),), 2, ((code, 21),)
    trace = Trace(device="cuda:0", steps=[[mm, cb0, warn, nz, cb1, cb2]], complete=[True], changes=[[]], held=[set()])
    sync = Inventory.from_findings(detectors.run(trace, None, cuda=True)).where("host-sync")
    assert sorted(zip(sync.line, sync.op)) == [(20, "aten.mm"), (21, "aten.nonzero"),
                                               (22, "cuda stream synchronization")]
    assert "sync-debug mode" in sync[sync.line == 20].message.iloc[0]


def _nested_trace(inner_op: str, inner_in: str, inner_out: str, lines):
    """A line (30) whose call runs Python code that makes a copy two frames deeper (a tensor subclass's
    `__torch_dispatch__` moving its host table to the device); torch hands the copy's sync warning to Python only
    when the outer call returns, so the warning's frame is line 30."""
    code = _record.__code__
    outer = ((code, lines[0]),)
    inner = _record(inner_op, [_meta([16], inner_in, pinned=False, sid=3)], [_meta([16], inner_out, sid=4)])
    inner.index, inner.stack = 0, outer + ((code, lines[1]), (code, lines[2]))
    warn = OpRecord(0, 1, "sync", "sync-debug", (), stack=outer, note="sync-debug\x00in\x00called a synchronizing CUDA op")
    mm = _record("aten.mm", [_meta([4], "cuda:0", sid=5)], [_meta([4], "cuda:0", sid=6)])
    mm.index, mm.stack = 2, outer
    return Trace(device="cuda:0", steps=[[inner, warn, mm]], complete=[True], changes=[[]], held=[set()])


def _lines(rng):
    return (torch.randperm(200, generator=rng)[:3] + 10).tolist()


def test_a_copy_nested_under_a_call_is_found_at_its_own_line_not_the_callers(rng):
    for op in ("aten.to", "aten._to_copy"):  # `to` undecomposed, as a subclass's dispatch shows it
        lines = _lines(rng)
        inv = Inventory.from_findings(detectors.run(_nested_trace(op, "cpu", "cuda:0", lines), None, cuda=True))
        found = sorted(zip(inv.df.category, inv.df.line))
        assert ("pageable-copy", lines[2]) in found, (op, found)
        assert not [c for c, line in found if c == "host-sync"], (op, found)  # the held warning is the copy's


def test_a_nested_op_that_syncs_nothing_leaves_the_warning_at_the_outer_line(rng):
    lines = _lines(rng)
    inv = Inventory.from_findings(detectors.run(_nested_trace("aten.to", "cuda:0", "cuda:0", lines), None, cuda=True))
    sync = inv.where("host-sync")
    assert list(sync.line) == [lines[0]] and "pageable-copy" not in set(inv.df.category)
