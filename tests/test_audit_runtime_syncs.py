"""CUDA scans: the waits sync-debug mode and the CUDA runtime report, on synthetic traces (audit/detectors/runtime_syncs.py).

A reported wait is a finding only on a line no other rule explains (a nonzero's line is the nonzero's), and a line
keeps one finding, under the op sync-debug mode named, whatever else the runtime reported there.
"""

from __future__ import annotations

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
