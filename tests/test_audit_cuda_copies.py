"""CUDA-scan copy rules over synthetic traces (no GPU needed): what a GPU scan records, ruled on.

A buffer the step pins itself and uploads (`torch.tensor(vals, pin_memory=True).to(dev, non_blocking=True)`)
is captured reading bytes of the captured step: silent corruption, where a persistent pinned staging buffer is
only info. `torch.where` with a 0-dim CPU operand copies it to the device from pageable memory: blocks capture,
where a multiply takes the same scalar as a kernel argument.
"""

from __future__ import annotations

import torch

from audit import detectors
from audit.report.inventory import Inventory
from audit.scan.records import OpRecord, TensorMeta, Trace

_CODE = (lambda: None).__code__


def _meta(shape, device, sid, pinned=None):
    return TensorMeta(tuple(shape), (1,), torch.float32, torch.device(device), 0, sid, sid, pinned)


def _rec(i, op, inputs, outputs, line, args=()):
    return OpRecord(0, i, "aten", op, args, tuple(inputs), tuple(outputs), (False,) * len(inputs),
                    (True,) * len(outputs), "", ((_CODE, line),))


def _scan(recs, born) -> Inventory:
    trace = Trace(device="cuda:0", steps=[list(recs)], complete=[True], changes=[[]], held=[set()], born=born)
    return Inventory.from_findings(detectors.run(trace, None, cuda=True))


def test_a_buffer_pinned_in_the_step_is_silent_corruption_a_kept_one_info(rng):
    n = int(torch.randint(2, 64, (1,), generator=rng))
    lines = (torch.randperm(80, generator=rng)[:3] + 10).tolist()
    fresh, kept = _meta([n], "cpu", 11, pinned=True), _meta([n], "cpu", 12, pinned=True)
    recs = [_rec(0, "aten.lift_fresh", [fresh], [fresh], lines[0]),
            _rec(1, "aten._to_copy", [fresh], [_meta([n], "cuda:0", 13)], lines[1], (("non_blocking", True),)),
            _rec(2, "aten.copy_", [_meta([n], "cuda:0", 14), kept], [], lines[2], ("<T>", "<T>", True))]
    got = _scan(recs, {11: (0, 0)}).where("pageable-copy")
    sev = dict(zip(got.line.astype(int), got.severity))
    assert sev == {lines[1]: "silent-corruption", lines[2]: "info"}, got[["line", "severity", "message"]]
    assert "pinned in the step" in got[got.line == lines[1]].message.iloc[0]


def test_where_with_a_cpu_scalar_operand_is_a_pageable_copy(rng):
    shape = torch.randint(1, 32, (2,), generator=rng).tolist()
    lines = (torch.randperm(80, generator=rng)[:3] + 10).tolist()
    sid = iter(range(100, 200))
    cond, x = _meta(shape, "cuda:0", next(sid)), _meta(shape, "cuda:0", next(sid))
    recs = [_rec(0, "aten.where", [cond, x, _meta([], "cpu", next(sid))], [_meta(shape, "cuda:0", next(sid))],
                 lines[0]),
            _rec(1, "aten.where", [_meta([], "cpu", next(sid)), x, _meta([], "cuda:0", next(sid))],
                 [_meta(shape, "cuda:0", next(sid))], lines[1]),
            _rec(2, "aten.mul", [x, _meta([], "cpu", next(sid))], [_meta(shape, "cuda:0", next(sid))], lines[2])]
    # sync-debug mode's warning for the copy inside where(), handed to Python after the op returned
    recs.append(OpRecord(0, 3, "sync", "sync-debug", (), stack=((_CODE, lines[0]),),
                         note="sync-debug\x00after\x00called a synchronizing CUDA operation"))
    got = _scan(recs, {})
    rows = got.where("pageable-copy")
    assert sorted(rows.line.astype(int)) == sorted(lines[:2]) and set(rows.severity) == {"blocks-capture"}
    assert "`where` takes a 0-dim host tensor" in rows.message.iloc[0] and "Python number" in rows.fix.iloc[0]
    assert got.where("host-sync").empty  # the copy's wait is the same finding, not a second one
