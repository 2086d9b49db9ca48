"""Cross-device work inside the step of a multi-device path.

On the CPU: the cross-device rule over synthetic traces of the copies a layer split across GPUs
makes (to(), copy_(), and ops left on the other GPU), with random shapes and sites. With 2 GPUs:
the planted step (tests/planted_gpu/cross_device_copy.py) scanned and bisected for real.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from audit import detectors
from audit.report.inventory import Inventory
from audit.scan.records import OpRecord, TensorMeta, Trace

PLANTED = Path(__file__).parent / "planted_gpu"
_CODE = (lambda: None).__code__


def _meta(shape, device, sid):
    return TensorMeta(tuple(shape), (1,), torch.float32, torch.device(device), 0, sid, sid, None)


def _rec(i, op, inputs, outputs, line, module="model.layers.1.hop"):
    return OpRecord(0, i, "aten", op, (), tuple(inputs), tuple(outputs), (False,) * len(inputs),
                    (True,) * len(outputs), module, ((_CODE, line),))


def _cross(home: str, recs, steps: int = 1) -> Inventory:
    trace = Trace(device=home, steps=[list(recs) for _ in range(steps)], complete=[True] * steps,
                  changes=[[] for _ in range(steps)], held=[set() for _ in range(steps)])
    inv = Inventory.from_findings(detectors.run(trace, None, cuda=True))
    return inv.where("cross-device")


def test_copies_between_gpus_are_flagged_at_their_lines(rng):
    shape = torch.randint(1, 64, (2,), generator=rng).tolist()
    lines = (torch.randperm(50, generator=rng)[:6] + 10).tolist()
    sid = iter(range(100, 200))
    recs = [
        _rec(0, "aten._to_copy", [_meta(shape, "cuda:0", next(sid))], [_meta(shape, "cuda:1", next(sid))], lines[0]),
        _rec(1, "aten.copy_", [_meta(shape, "cuda:1", next(sid)), _meta(shape, "cuda:0", next(sid))], [], lines[1]),
        _rec(2, "aten.tanh", [_meta(shape, "cuda:1", next(sid))], [_meta(shape, "cuda:1", next(sid))], lines[2]),
        _rec(3, "aten.add", [_meta(shape, "cuda:0", next(sid))], [_meta(shape, "cuda:0", next(sid))], lines[3]),
        _rec(4, "aten._to_copy", [_meta(shape, "cuda:0", next(sid))], [_meta(shape, "cpu", next(sid))], lines[4]),
        _rec(5, "aten.mul", [_meta(shape, "cuda:0", next(sid)), _meta([], "cpu", next(sid))],
             [_meta(shape, "cuda:0", next(sid))], lines[5]),
        # a jagged nested tensor's view takes a meta placeholder for its ragged size: no memory, no kernel
        _rec(6, "aten._nested_view_from_jagged", [_meta(shape, "cuda:0", next(sid)), _meta([shape[0] + 1], "cuda:0",
             next(sid)), _meta([0, shape[0]], "meta", next(sid))], [_meta(shape, "cuda:0", next(sid))], lines[5] + 60),
    ]
    steps = int(torch.randint(2, 4, (1,), generator=rng))
    got = _cross("cuda:0", recs, steps)
    # both copies span two GPUs; the op left on cuda:1 runs outside a graph captured on cuda:0;
    # work on the home GPU, a device->host copy (pageable-copy's business), CPU scalars and meta placeholders are fine
    assert sorted(got.line) == sorted(lines[:3])
    assert set(got.severity) == {"silent-corruption"} and set(got.module) == {"model.layers.1.hop"}
    assert list(got.count_per_step) == [1.0] * 3
    span = got[got.line == lines[0]].message.iloc[0]
    assert "cuda:0" in span and "cuda:1" in span and "_to_copy" in span
    assert "one graph per device" in got.fix.iloc[0].lower()
    # a scan of a bare `cuda` cannot tell which GPU is home: only ops touching two GPUs count
    assert sorted(_cross("cuda", recs).line) == sorted(lines[:2])


def test_cpu_scans_do_not_run_the_cuda_rule():
    recs = [_rec(0, "aten._to_copy", [_meta([4], "cuda:0", 1)], [_meta([4], "cuda:1", 2)], 12)]
    trace = Trace(device="cpu", steps=[recs], complete=[True], changes=[[]], held=[set()])
    assert Inventory.from_findings(detectors.run(trace, None, cuda=False)).where("cross-device").empty


# ---------------------------------------------------------------------- 2 GPUs
def _need_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")


@pytest.mark.gpu
def test_scan_flags_the_planted_cross_device_copy():
    _need_two_gpus()
    import audit

    sys.path.insert(0, str(PLANTED))
    from planted_common import marker_line

    path = PLANTED / "cross_device_copy.py"
    inv = audit.scan(f"{path}:make", device="cuda:0")
    rows = inv.where("cross-device")
    here = rows[rows.file.astype(str).str.endswith("cross_device_copy.py")]
    assert marker_line(str(path)) in set(here.line), rows[["file", "line", "op", "message"]].to_string()
    assert set(rows.module) <= {"model.layers.1.hop", "model.layers.1.hop.far", "model.layers.1.hop.far.lin"}, \
        rows[["file", "line", "module"]].to_string()
    assert (rows.severity == "silent-corruption").all()


@pytest.mark.gpu
def test_bisect_names_the_module_that_hops_devices():
    _need_two_gpus()
    from audit.capture.pool import CapturePool
    from audit.capture.bisect import bisect, findings, parse_layers

    sess = {"target": f"{PLANTED / 'cross_device_copy.py'}:make", "device": "cuda:0"}
    with CapturePool(sess, timeout=600) as pool:
        info = pool.start()
        report = bisect(pool.capture, [info["layers"][i] for i in parse_layers(None, len(info["layers"]))])
    leaves = [n.path for n in report.leaves]
    assert leaves and all(p.startswith("model.layers.1.hop") for p in leaves), leaves
    cats = {f.category for f in findings(report)}
    assert cats & {"capture-failure", "uncaptured-kernel", "cross-device", "replay-mismatch"}, cats
