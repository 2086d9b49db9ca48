"""Sync-debug warnings on a synthetic CUDA trace (issue 14, point 3): the op a warning belongs to,
and one copy = one finding (a pageable host->device copy explains the sync on its line)."""

from __future__ import annotations

import torch

from audit import detectors
from audit.report.inventory import Inventory
from audit.scan.records import OpRecord, TensorMeta, Trace


def _code():
    return _code.__code__


def _m(dev, sid, pinned=None):
    return TensorMeta((4,), (1,), torch.float32, torch.device(dev), sid, sid, sid, pinned)


def _op(i, name, line, ins=(), outs=()):
    return OpRecord(0, i, "aten", name, (), tuple(ins), tuple(outs), (False,) * len(ins), (True,) * len(outs),
                    stack=((_code(), line),))


def _warn(i, line, where):
    return OpRecord(0, i, "sync", "sync-debug", (), stack=((_code(), line),),
                    note=f"sync-debug\x00{where}\x00called a synchronizing CUDA operation")


def _run(recs):
    trace = Trace(device="cuda:0", steps=[recs], complete=[True], changes=[[]], held=[set()])
    return Inventory.from_findings(detectors.run(trace, None, cuda=True))


def test_the_warning_names_the_op_it_surfaced_in_or_after():
    after = [_op(0, "aten.mul", 10), _op(1, "aten.linalg_inv_ex", 11), _warn(2, 11, "after"), _op(3, "aten.add", 11)]
    inside = [_op(0, "aten.mul", 10), _warn(1, 11, "in"), _op(2, "aten.linalg_inv_ex", 11), _op(3, "aten.add", 11)]
    for recs in (after, inside):
        sync = _run(recs).where("host-sync")
        assert list(zip(sync.line, sync.op)) == [(11, "aten.linalg_inv_ex")]


def test_a_pageable_host_to_device_copy_is_one_finding():
    copy = _op(0, "aten._to_copy", 19, [_m("cpu", 1, pinned=False)], [_m("cuda:0", 2)])
    inv = _run([copy, _warn(1, 19, "after"), _op(2, "aten.add", 19, [_m("cuda:0", 2)], [_m("cuda:0", 3)])])
    bad = inv.df[inv.df.severity != "info"]
    assert list(zip(bad.line, bad.category)) == [(19, "pageable-copy")]


def test_host_data_lifted_onto_the_device_is_one_pageable_copy():
    """torch.tensor(data, device=cuda): the copy is not dispatched on its own, the sync-debug warning
    lands on the lifted op; that is the copy's own sync, explained by one pageable-copy finding."""
    n = int(torch.randint(1, 64, (1,)))
    lifted = TensorMeta((n,), (1,), torch.float32, torch.device("cuda:0"), 7, 7, 7, None)
    lift = OpRecord(0, 0, "aten", "aten.lift_fresh", (), (lifted,), (lifted,), (False,), (False,),
                    stack=((_code(), 24),))
    inv = _run([_warn(0, 24, "in"), lift, _op(2, "aten.add", 25, [lifted], [_m("cuda:0", 8)])])
    bad = inv.df[inv.df.severity != "info"]
    assert list(zip(bad.line, bad.category)) == [(24, "pageable-copy")]


def test_empty_host_data_copies_nothing():
    empty = TensorMeta((0,), (1,), torch.float32, torch.device("cuda:0"), 9, 9, 9, None)
    lift = OpRecord(0, 0, "aten", "aten.lift_fresh", (), (empty,), (empty,), (False,), (False,),
                    stack=((_code(), 28),))
    inv = _run([lift, _op(1, "aten.add", 29, [_m("cuda:0", 4)], [_m("cuda:0", 5)])])
    assert inv.where("pageable-copy").empty and inv.where("host-sync").empty
