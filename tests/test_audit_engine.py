"""The engine itself: the trace, leaving the program as found, bad targets, partial inventories,
the registry, merging, the CUDA-only rules on a synthetic trace, and the markdown / diff output."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module

import audit
from audit import detectors
from audit.report import writers as report
from audit.scan.patches import hooks
from audit.errors import AuditError, TargetFailed
from audit.report.inventory import CATEGORIES, Finding, Inventory
from audit.scan.records import OpRecord, TensorMeta, Trace
from audit.scan.tracer import Tracer

PLANTED = Path(__file__).parent / "planted"
CPU_CATEGORIES = ["host-sync", "step-allocation", "data-dependent-control", "baked-host-value", "dynamic-shape",
                  "stale-input-pointer", "cpu-side-effect", "rng"]


# ---------------------------------------------------------------------- a small stateful target
class Toy(nn.Module):
    """Buffers updated in place, a Python counter, a host read: enough to touch every hook."""

    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.lin = nn.Linear(16, 16)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(16, 16, generator=g))
            self.lin.bias.copy_(torch.randn(16, generator=g))
        self.register_buffer("acc", torch.zeros(16))
        self.x = torch.zeros(16)
        self.gen = g
        self.calls = 0

    def prepare(self, i):
        self.x.copy_(torch.randn(16, generator=self.gen))

    @torch.no_grad()
    def step(self):
        y = torch.relu(self.lin(self.x))
        self.acc.add_(y)
        self.calls += 1
        return y.sum().item()


def _fingerprint(m: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(m.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _global_state():
    return (dict(torch.Tensor.__dict__).keys() - {"__annotations__"},
            torch.cuda.synchronize, torch.cuda.Event.synchronize, torch.cuda.Stream.synchronize,
            nn.Module.__setattr__, len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks),
            torch._C._len_torch_dispatch_stack(), hooks._ACTIVE)


def test_scan_changes_nothing_it_should_not():
    seed = int(torch.randint(0, 2**31, ()).item())
    plain, scanned = Toy(seed), Toy(seed)
    weights_before = _fingerprint(scanned.lin)
    for i in range(6):
        plain.prepare(i)
        plain.step()
    before = _global_state()
    inv = audit.scan(lambda device: scanned, steps=4, warmup=2)
    assert _global_state() == before
    assert audit.scan(Toy(seed), steps=2, warmup=0).meta["audited_steps"] == 2  # an object works too
    assert _fingerprint(scanned.lin) == weights_before          # weights untouched
    assert _fingerprint(scanned) == _fingerprint(plain)         # state exactly as without the audit
    assert scanned.calls == plain.calls == 6
    assert {"host-sync", "cpu-side-effect"} <= set(inv.df.category)


class Boom(Toy):
    def step(self):
        if self.calls == 3:
            raise RuntimeError("kaboom")
        return super().step()


def test_target_raising_mid_step_gives_partial_inventory_and_restores_everything():
    before = _global_state()
    with pytest.raises(TargetFailed) as ei:
        audit.scan(lambda device: Boom(0), steps=4, warmup=2)
    assert _global_state() == before
    msg = str(ei.value)
    assert "kaboom" in msg and "audited iteration 3" in msg and "\n" not in msg
    inv = ei.value.inventory
    assert inv.meta["audited_steps"] == 1 and inv.meta["error"] == msg
    assert "host-sync" in set(inv.df.category)  # found in the step that completed


@pytest.mark.parametrize("spec, text", [
    ("nope/missing.py:make", "no such file"),
    (f"{PLANTED}/host_sync.py:nothing", "has no factory 'nothing'"),
    (f"{PLANTED}/host_sync.py", "expected FILE.py:FACTORY"),
    ("dsv4:enormous", "unknown preset"),
])
def test_bad_target_specs(spec, text):
    with pytest.raises(AuditError, match=text) as ei:
        audit.scan(spec)
    assert "\n" not in str(ei.value)


def test_factory_raising_and_wrong_protocol(tmp_path):
    f = tmp_path / "t.py"
    f.write_text("def bad(device):\n    raise KeyError('weights')\n\ndef odd(device):\n    return object()\n"
                 "syntax = 1\n")
    with pytest.raises(AuditError, match=r"factory raised KeyError: 'weights' \(at .*t.py:2\)"):
        audit.scan(f"{f}:bad")
    with pytest.raises(AuditError, match=r"without prepare\(\) and step\(\)"):
        audit.scan(f"{f}:odd")
    with pytest.raises(AuditError, match="not callable"):
        audit.scan(f"{f}:syntax")
    (tmp_path / "broken.py").write_text("def make(:\n")
    with pytest.raises(AuditError, match="importing .* raised SyntaxError"):
        audit.scan(f"{tmp_path / 'broken.py'}:make")


@pytest.mark.parametrize("kw, text", [({"steps": 1}, "--steps"), ({"warmup": -1}, "--warmup"),
                                      ({"device": "tpu"}, "--device"), ({"path": "fast"}, "--path")])
def test_bad_options(kw, text):
    with pytest.raises(AuditError, match=text):
        audit.scan(f"{PLANTED}/rng.py:make", **kw)


def test_cuda_requested_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(AuditError, match="CUDA is not available"):
        audit.scan(f"{PLANTED}/rng.py:make", device="cuda")


def test_trace_records_what_detectors_need():
    toy = Toy(1)
    tracer = Tracer(toy, "cpu")
    for k in range(2):
        toy.prepare(k)
        with tracer.step(k):
            tracer.call(toy.step)
    tr = tracer.trace
    assert tr.complete == [True, True] and len(tr.steps) == 2
    ops = [r for r in tr.steps[0] if r.kind == "aten"]
    mm = next(r for r in ops if r.op == "aten.addmm")
    assert mm.module == "lin" and mm.frame[:1] == (__file__,) and mm.frame[2] == "step"  # nn.Linear is not user code
    relu = next(r for r in ops if r.op == "aten.relu")
    assert relu.frame[0] == __file__ and relu.frame[2] == "step" and relu.module == ""
    assert relu.in_step == (True,) and relu.new == (True,)
    add_ = next(r for r in ops if r.op == "aten.add_")
    assert add_.new == (False,) and add_.outputs[0].sid == add_.inputs[0].sid
    host = [r for r in tr.steps[0] if r.kind == "host"]
    assert [r.op for r in host] == ["Tensor.item"]
    nested = [r for r in ops if r.op == "aten._local_scalar_dense"]
    assert nested and all(r.nested for r in nested)
    assert any(r.kind == "setattr" and r.note.endswith("\x00calls") for r in tr.steps[0])
    assert [c.attr for c in tr.changes[0]] == ["calls"]
    tracer.close()


# ---------------------------------------------------------------------- registry, inventory, CUDA rules
def test_registry_covers_every_cpu_category_with_documented_rules():
    detectors._load()
    for cat in CPU_CATEGORIES + ["cross-device", "pageable-copy"]:
        rules = detectors.REGISTRY[cat]
        assert rules, cat
        assert all(len(r.doc) > 20 for r in rules), cat
    with pytest.raises(ValueError):
        detectors.register("not-a-category")
    for c in CATEGORIES.values():
        assert len(c.why) > 60 and len(c.fix) > 30


def test_inventory_merges_duplicates_and_round_trips():
    f = {"category": "host-sync", "file": "a.py", "line": 3, "function": "f", "module": "m", "op": "aten.nonzero",
         "message": "m"}
    inv = Inventory.from_findings([Finding(severity="info", count_per_step=2, **f),
                                   Finding(severity="blocks-capture", count_per_step=1, **f),
                                   Finding(severity="info", count_per_step=1, **dict(f, line=4), extra={"rank": 1})],
                                  {"target": "x"})
    assert len(inv) == 2
    top = inv.findings()[0]
    assert top["severity"] == "blocks-capture" and top["count_per_step"] == 2 and "rank" not in top
    assert inv.findings()[1]["rank"] == 1
    back = Inventory.from_json_dict(json.loads(json.dumps(inv.to_json_dict())))
    assert back.findings() == inv.findings() and back.meta == inv.meta
    with pytest.raises(ValueError):
        Finding("nope", "info", "a.py", 1, "f", "", "op", 1, "m")


def _meta(shape, device, pinned=None, sid=1):
    return TensorMeta(torch.Size(shape), (1,), torch.float32, torch.device(device), 0, sid, sid, pinned)


def _record(op, inputs, outputs, step=0):
    code = _record.__code__
    return OpRecord(step, 0, "aten", op, (), tuple(inputs), tuple(outputs), (False,) * len(inputs),
                    (True,) * len(outputs), "blk", ((code, 7),))


def test_cuda_only_rules_on_a_synthetic_trace():
    recs = [_record("aten._to_copy", [_meta([4], "cpu", pinned=False)], [_meta([4], "cuda:0", sid=2)]),
            _record("aten.copy_", [_meta([4], "cuda:0", sid=3), _meta([4], "cpu", pinned=True, sid=4)], []),
            _record("aten._to_copy", [_meta([4], "cuda:0", sid=5)], [_meta([4], "cpu", sid=6)]),
            _record("aten.add", [_meta([4], "cuda:0", sid=7), _meta([4], "cuda:1", sid=8)], [_meta([4], "cuda:0")])]
    for i, r in enumerate(recs):
        r.index = i
        r.stack = ((_record.__code__, 10 + i),)
    trace = Trace(device="cuda:0", steps=[recs], complete=[True], changes=[[]], held=[set()])
    inv = Inventory.from_findings(detectors.run(trace, None, cuda=True))
    page = inv.where("pageable-copy").sort_values("line")
    assert list(page.severity) == ["blocks-capture", "info"]
    assert list(inv.where("cross-device").line) == [13]
    assert 12 in set(inv.where("host-sync").line)  # device->host copy: one read, one (host-sync) finding
    assert 12 not in set(page.line)
    assert inv.where("pageable-copy").file.iloc[0].endswith("test_audit_engine.py")
    assert Inventory.from_findings(detectors.run(trace, None, cuda=False)).where("pageable-copy").empty


# ---------------------------------------------------------------------- report files and diff
def test_report_files_are_complete_and_diff_tolerates_line_shifts(tmp_path):
    inv = audit.scan(f"{PLANTED}/baked_host_value.py:make")
    paths = report.write(inv, tmp_path / "a")
    data = json.loads(paths["json"].read_text())
    assert data["summary"]["target"].endswith("baked_host_value.py:make") and data["summary"]["traced_ops"] > 0
    assert len(data["findings"]) == len(inv)
    md = paths["md"].read_text()
    assert md.startswith("# CUDA-graph readiness inventory") and "## baked-host-value" in md
    assert "| file:line | op | count/step | severity | why it matters | fix |" in md
    import pandas as pd

    assert len(pd.read_csv(paths["csv"])) == len(inv)
    assert not list((tmp_path / "a").glob(".*.tmp"))
    # baseline: one finding fixed, one new, the rest moved down two lines
    base = json.loads(paths["json"].read_text())
    rows = base["findings"]
    fixed = dict(rows[0], op="aten.gone")
    rows[0] = fixed
    for r in rows[1:]:
        r["line"] -= 2
    (tmp_path / "b.json").write_text(json.dumps(base))
    text = report.diff_markdown(report.load(paths["json"]), report.load(tmp_path / "b.json"))
    assert "**1 fixed**" in text and "**1 new**" in text and f"**{len(rows) - 1} remaining**" in text
    assert "(was line" in text and "aten.gone" in text


def test_report_load_errors(tmp_path):
    with pytest.raises(AuditError, match="no such file"):
        report.load(tmp_path / "none.json")
    (tmp_path / "x.json").write_text("{nope")
    with pytest.raises(AuditError, match="not valid JSON"):
        report.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("[1, 2]")
    with pytest.raises(AuditError, match="not an inventory"):
        report.load(tmp_path / "y.json")


def test_scans_do_not_nest():
    inner = {}

    class Nested(Toy):
        def step(self):
            try:
                audit.scan(f"{PLANTED}/rng.py:make")
            except AuditError as e:
                inner["error"] = str(e)
            return super().step()

    audit.scan(lambda device: Nested(0), steps=2, warmup=0)
    assert "scans do not nest" in inner["error"]
    assert hooks._ACTIVE is None and "item" not in torch.Tensor.__dict__


def test_cuda_scan_plumbing_without_a_gpu(monkeypatch):
    """Sync-debug warnings raised inside an op land on that op's line; the program's own warnings
    still reach the caller; the sync-debug mode is restored. (A custom op stands in for a CUDA sync.)"""
    import warnings

    mode = {"now": 0}
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode["now"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: mode.__setitem__("now", m))

    @torch.library.custom_op("audit_test::syncs", mutates_args=())
    def syncs(x: torch.Tensor) -> torch.Tensor:
        warnings.warn("called a synchronizing CUDA operation")
        return x.clone()

    class T:
        x = torch.ones(4)

        def prepare(self, i):
            pass

        def step(self):
            y = self.x * 2
            warnings.warn("the program's own warning")
            return torch.ops.audit_test.syncs(y)  # the sync line

    t = T()
    tracer = Tracer(t, "cuda")
    seen_modes = []

    def two_steps():
        for k in range(2):
            with tracer.step(k):
                seen_modes.append(mode["now"])
                tracer.call(t.step)

    with pytest.warns(UserWarning, match="program's own"):
        two_steps()
    assert seen_modes == ["warn", "warn"] and mode["now"] == 0
    inv = Inventory.from_findings(detectors.run(tracer.trace, t, cuda=True))
    sync = inv.where("host-sync")
    line = T.step.__code__.co_firstlineno + 3
    assert list(sync.line) == [line] and "sync-debug mode" in sync.message.iloc[0]
    tracer.close()


def test_event_and_stream_waits_are_reported_and_still_run(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: calls.append("event"))
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", lambda self: calls.append("stream"))
    monkeypatch.setattr(torch.cuda.Event, "query", lambda self: True)
    patched = (torch.cuda.Event.synchronize, torch.cuda.Stream.synchronize, torch.cuda.Event.query)

    class Waits:
        def prepare(self, i):
            pass

        def step(self):
            y = torch.ones(2) * 2
            torch.cuda.Event.synchronize(self)
            torch.cuda.Stream.synchronize(self)
            assert torch.cuda.Event.query(self)
            return y

    inv = audit.scan(lambda device: Waits(), steps=2, warmup=1)
    sync = inv.where("host-sync")
    assert set(sync.op) == {"Event.synchronize", "Stream.synchronize", "Event.query"}
    assert sorted(sync.line - Waits.step.__code__.co_firstlineno) == [2, 3, 4]
    assert calls == ["event", "stream"] * 3  # the program's calls still happen
    assert (torch.cuda.Event.synchronize, torch.cuda.Stream.synchronize, torch.cuda.Event.query) == patched


ROTATING = '''
import torch
class Rotating:
    def __init__(self, device):
        self.w = torch.randn(8, 8, device=device)
        self.pool = [torch.zeros(1, 8, device=device) for _ in range(3)]
        self.x, self.i = torch.randn(1, 8, device=device), 0
    def prepare(self, i):
        self.i = i % 3
        self.x, self.m = torch.randn(1, 8), torch.ones(2, 4)  # rebound: read from another storage each step
    def step(self):
        m = self.m.view(1, -1)
        y = self.x @ self.w + m
        torch.tanh(y, out=self.pool[self.i])  # a rotating out= buffer: written, not read
        return self.pool[self.i]
def make(device):
    return Rotating(device)
'''


def test_stale_pointer_says_whether_the_rebound_tensor_is_read_or_written(tmp_path):
    (path := tmp_path / "rotating.py").write_text(ROTATING)
    inv = audit.scan(f"{path}:make", device="cpu", steps=4)
    msgs = list(inv.df[inv.df.category == "stale-input-pointer"].message)
    assert all(any(m.startswith(f"reads `{n}`") for m in msgs) for n in "xm"), msgs  # m: first touched by a view
    assert any(m.startswith("writes into `pool[") for m in msgs), msgs
