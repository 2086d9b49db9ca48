"""Trial-capture machinery that runs without a GPU: error classification, state snapshots, static
inputs, bitwise comparison, call recording, module naming, and the worker protocol on the CPU."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from audit._capture_record import CallWatch, module_methods
from audit._capture_state import RandomFeed, Snapshot, bits_equal, clone_tree, compare_trees, max_abs_diff
from audit._capture_target import all_modules, children_of, find_layers, resolve_module, source_info
from audit.capture import CaptureResult, check_stream_device, classify_error, error_text, raised_at
from audit.errors import AuditError

PLANTED = Path(__file__).parent / "planted_gpu"
sys.path.insert(0, str(PLANTED))

# ---------------------------------------------------------------------- classification
# Texts as torch 2.11 prints them (HAZARDS.md, measured on an H200), boilerplate included.
BOILER = ("\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
          "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
          "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
CASES = [
    ("CUDA error: operation failed due to a previous error during capture\nSearch for "
     "`cudaErrorStreamCaptureInvalidated' in https://docs.nvidia.com/cuda/..." + BOILER, "sync-during-capture"),
    ("CUDA error: operation not permitted when stream is capturing" + BOILER, "sync-during-capture"),
    ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned. "
     "Please pin the CPU tensor.", "unpinned-copy"),
    ("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cuda:1!",
     "cross-device"),
    ("CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`", "external-allocation"),
    ("CUDA driver error: cuMemAlloc failed: operation not permitted when stream is capturing",
     "external-allocation"),
    ("CUDA error: operation would make the legacy stream depend on a capturing blocking stream\nSearch for "
     "`cudaErrorStreamCaptureImplicit'" + BOILER, "illegal-op"),
    ("CUDA error: capture was not joined (cudaErrorStreamCaptureUnjoined)", "illegal-op"),
    ("CUDA error: an illegal memory access was encountered" + BOILER, "illegal-op"),
    ("something else entirely", "other"),
    ("Offset increment outside graph capture encountered unexpectedly.", "illegal-op"),
]


@pytest.mark.parametrize("text,cls", CASES)
def test_classify_error(text, cls):
    assert classify_error(text) == cls


def test_boilerplate_does_not_make_everything_illegal():
    assert classify_error("RuntimeError: weird" + BOILER) == "other"


def _user_level_failure():
    raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU "
                       "tensor is pinned")


def test_error_chain_text_and_raising_line():
    """capture_end's complaint replaces the body's error: both texts count, the body's line wins."""
    try:
        try:
            _user_level_failure()
        except RuntimeError:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
    except RuntimeError as e:
        exc = e
    text = error_text(exc)
    assert text.index("Cannot copy") < text.index("previous error")
    assert classify_error(text) == "unpinned-copy"
    at = raised_at(exc)
    assert at["function"] == "_user_level_failure"
    assert at["file"] == __file__ and "raise RuntimeError" in at["code"]


def test_result_roundtrip_and_describe():
    r = CaptureResult(path="a.b", status="mismatch", max_abs_diff=0.5, first_diff="step 1: out[0]")
    again = CaptureResult.from_dict(r.to_dict() | {"unknown": 1})
    assert again == r and again.failing and "step 1: out[0]" in again.describe()
    assert not CaptureResult(status="not-called").failing


def test_stream_device_check_names_both_devices():
    class FakeStream:
        device = torch.device("cuda", 0)

    msg = check_stream_device(FakeStream(), "cuda:1")
    assert "cuda:0" in msg and "cuda:1" in msg and "torch.cuda.Stream(device=" in msg
    assert check_stream_device(FakeStream(), "cuda:0") is None


def test_trial_without_cuda_is_an_error_result():
    from audit.capture import trial_capture

    r = trial_capture(lambda: None, device="cpu")
    assert r.status == "error" and "CUDA" in r.error


# ---------------------------------------------------------------------- state
@dataclasses.dataclass
class Cache:
    kv: torch.Tensor
    n: int = 0


class Stateful(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("buf", torch.zeros(3, 4))
        self.cache = Cache(torch.zeros(2))
        self.pos = 0
        self.history: list = []
        self.gen = torch.Generator().manual_seed(1)

    def forward(self, x):
        self.buf[self.pos % 3] = self.lin(x)
        self.cache.kv += 1
        self.cache.n += 1
        self.pos += 1
        self.history.append(self.pos)
        return self.buf.sum(0) + torch.rand(1, generator=self.gen)


def test_snapshot_restores_in_place():
    m = Stateful()
    snap = Snapshot({"": m})
    buf_ptr, kv = m.buf.data_ptr(), m.cache.kv
    first = m(torch.ones(4))
    m(torch.ones(4))
    assert snap.changed().keys() == {"buf", "cache.kv"}
    snap.restore()
    assert m.pos == 0 and m.cache.n == 0 and m.history == [] and m.cache.kv is kv
    assert m.buf.data_ptr() == buf_ptr and not m.buf.any() and not m.cache.kv.any()
    assert torch.equal(m(torch.ones(4)), first)  # the generator was rewound too


def test_snapshot_skips_weights_and_weight_views():
    m = Stateful()
    m.bank = m.lin.weight.data[None]  # a stacked view of a parameter, like a MoE weight bank
    snap = Snapshot({"": m})
    paths = {p for p, _, _ in snap.tensors}
    assert "bank" not in paths and "lin.weight" not in paths and "buf" in paths


def test_compare_state_against_eager_record():
    m = Stateful()
    snap = Snapshot({"": m})
    m(torch.ones(4))
    record = snap.changed()
    snap.restore()
    m(torch.ones(4))
    assert snap.compare_state(record) is None
    m.buf[2] = 7.0
    d = snap.compare_state(record)
    assert d[1] == "state buf" and d[0] == pytest.approx(7.0, abs=10)


def test_clone_tree_keeps_aliasing_and_dataclasses():
    t = torch.arange(4.0)
    c = Cache(t)
    out = clone_tree((t, [t, c], {"k": t}))
    assert out[0] is out[1][0] is out[2]["k"] is out[1][1].kv
    assert out[0] is not t and torch.equal(out[0], t)


def test_random_feed_is_fresh_reproducible_and_in_range():
    x = torch.randn(8, 16) * 3 + 5
    mask = torch.zeros(4, 4).masked_fill(torch.eye(4, dtype=torch.bool), float("-inf"))
    ids = torch.tensor([3, 9, 1, 7])
    flags = torch.tensor([True, False])
    static = clone_tree(((x, mask, ids, flags), {}))
    feed = RandomFeed(static, seed=4)
    feed(0)
    a = [t.clone() for t in static[0]]
    feed(1)
    b = [t.clone() for t in static[0]]
    feed(0)
    assert all(torch.equal(p, q) for p, q in zip(a, static[0]))  # same k -> same values
    assert not torch.equal(a[0], x) and not torch.equal(a[0], b[0])
    assert torch.isinf(a[1]).equal(torch.isinf(mask))             # -inf pattern kept
    assert sorted(a[2].tolist()) == sorted(ids.tolist())          # ints: a permutation
    assert torch.equal(a[3], flags)
    assert abs(a[0].mean().item() - 5) < 1.5


def test_bitwise_comparison_semantics():
    nan = torch.tensor([float("nan"), 1.0])
    assert bits_equal(nan, nan.clone())                              # NaN == NaN bitwise
    assert not bits_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert max_abs_diff(torch.tensor([0.0]), torch.tensor([-0.0])) == 0.0
    assert max_abs_diff(nan, torch.tensor([1.0, 1.0])) == math.inf
    a = {"logits": torch.ones(3), "aux": [torch.zeros(2), None]}
    b = {"logits": torch.ones(3), "aux": [torch.tensor([0.0, 0.25]), None]}
    assert compare_trees(a, clone_tree(a)) is None
    assert compare_trees(a, b) == (0.25, "out['aux'][0]")
    assert compare_trees([torch.ones(2)], [torch.ones(2), 1])[1].startswith("out (length")


# ---------------------------------------------------------------------- call recording
class Inner(nn.Module):
    def forward(self, x):
        return x * 2


class Attn(nn.Module):
    """Called through a method, not forward, like dsv4's attn.decode(x, pos)."""

    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.unused = Inner()

    def decode(self, x, pos: int):
        return self.project(x) + pos

    def project(self, x):
        return self.inner(x)

    def broken(self, x):
        return _explode(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn()

    def forward(self, x):
        y = self.attn.decode(x, 3)
        x.add_(1)  # mutates its input after the call: the record must be a clone
        return y


def test_callwatch_records_outermost_method_calls_with_cloned_args():
    blk = Block()
    mods = dict(blk.named_modules(prefix="blk"))
    x = torch.zeros(2)
    with CallWatch(mods, record=blk.attn) as w:
        blk(x)
    assert [c.method for c in w.calls] == ["decode"]            # not project(): it is nested
    args = w.calls[0].args
    assert torch.equal(args[0], torch.zeros(2)) and args[1] == 3
    assert w.ran(blk.attn.inner) and not w.ran(blk.attn.unused)
    assert not any(n in vars(blk.attn) for n in module_methods(blk.attn))  # unwrapped


def _explode(x):
    raise RuntimeError("boom")


def test_callwatch_names_the_innermost_module_that_raised():
    blk = Block()
    mods = dict(blk.named_modules(prefix="blk"))
    with CallWatch(mods) as w:
        with pytest.raises(RuntimeError) as own:
            blk.attn.broken(torch.zeros(1))              # raised by attn's own code (a plain helper)
        assert w.raised_in_chain(own.value) == "blk.attn"
        assert w.raised_in_chain(RuntimeError("other")) is None
    blk.attn.inner.forward = _explode                  # now raised inside the child
    with CallWatch(mods) as w:
        with pytest.raises(RuntimeError) as inner:
            blk(torch.zeros(1))
        assert w.raised_in_chain(inner.value) == "blk.attn.inner"
    assert blk.attn.inner.forward is _explode           # the user's own instance attribute is kept


def test_module_methods_are_the_users_own():
    names = module_methods(Attn())
    assert {"forward", "decode", "project"} <= set(names) and "to" not in names and "_apply" not in names


# ---------------------------------------------------------------------- module naming
class Wrapper(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.block = blocks


class Holder:
    """A static-path-like target: the model, plus a list of wrappers around the same blocks."""

    def __init__(self):
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(Block() for _ in range(3))
        self.model.small = nn.ModuleList([nn.Linear(1, 1)])
        self.dec = nn.Module()
        self.dec.layers = nn.ModuleList(Wrapper(b) for b in self.model.layers)


def test_module_paths_are_shortest_and_unique():
    h = Holder()
    mods = all_modules(h)
    assert mods["model.layers.1.attn"] is h.model.layers[1].attn
    assert "dec.layers.1.block" not in mods and "dec.layers.1" in mods
    assert resolve_module(h, "dec.layers.1.block.attn") is h.model.layers[1].attn
    with pytest.raises(AuditError, match="nothing named 'nope'"):
        resolve_module(h, "model.nope")


def test_find_layers_prefers_the_list_that_ran_then_the_richer_wrapper():
    h = Holder()
    assert find_layers(h)[0] == "dec.layers"            # same params, more submodules
    ran = {id(b) for b in h.model.layers}
    assert find_layers(h, called=ran) == ("model.layers", ["model.layers.0", "model.layers.1", "model.layers.2"])
    assert find_layers(h, root="model.layers.0") == ("model.layers.0", ["model.layers.0.attn"])


def test_children_look_through_module_lists():
    m = nn.Module()
    m.experts = nn.ModuleList(nn.Linear(1, 1) for _ in range(2))
    m.shared = nn.Linear(1, 1)
    assert [p for p, _ in children_of(m, "ffn")] == ["ffn.experts.0", "ffn.experts.1", "ffn.shared"]


def test_source_info_points_at_the_captured_method():
    info = source_info(Attn(), "decode")
    assert info["file"] == __file__ and info["function"] == "decode"
    assert open(__file__).read().splitlines()[info["line"] - 1].strip().startswith("def decode")
    assert any(a == __file__ and b <= info["line"] <= c for a, b, c in info["ranges"])


# ---------------------------------------------------------------------- the worker, on the CPU
def test_worker_records_and_reports_without_cuda():
    """Everything before the capture itself runs on the CPU: target, layers, recording, children."""
    from audit._capture_worker import Worker

    w = Worker({"target": f"{PLANTED / 'baked_pos.py'}:make", "device": "cpu", "target_warmup": 1})
    info = w.start()
    assert info["layers_root"] == "model.layers" and len(info["layers"]) == 3
    res = w.capture("model.layers.1")
    assert res.status == "error" and "CUDA" in res.error
    assert res.module_type == "Layer" and res.source["function"] == "forward"
    assert [c["path"] for c in res.children] == ["model.layers.1.norm", "model.layers.1.mix", "model.layers.1.writer"]
    assert all(c["called"] for c in res.children)
    writer = w.obj.model.layers[1].writer
    assert writer.pos == 1  # after the one target-warmup step; the recording steps were rolled back
    step = w.capture(None)
    assert step.path == "<step>" and [c["path"] for c in step.children] == info["layers"]
    assert w.capture("model.nothing").status == "error"


@pytest.mark.slow
def test_pool_protocol_and_respawn_on_cpu():
    """The subprocess path end to end: ready line, a result per request, a new worker after an error."""
    from audit._capture_pool import CapturePool

    with CapturePool({"target": f"{PLANTED / 'host_sync.py'}:make", "device": "cpu"}, timeout=300) as pool:
        info = pool.start()
        assert info["layers"][1] == "model.layers.1"
        r = pool.capture("model.layers.1.gate")
        assert r.status == "error" and r.module_type == "Gate"
        r2 = pool.capture(None)
        assert r2.status == "error" and pool.spawned == 2


def test_pool_reports_a_target_that_cannot_start(tmp_path):
    from audit._capture_pool import CapturePool

    bad = tmp_path / "bad.py"
    bad.write_text("def make(device):\n    raise ValueError('no such model')\n")
    with pytest.raises(AuditError, match="no such model"):
        with CapturePool({"target": f"{bad}:make", "device": "cpu"}, timeout=120) as pool:
            pool.start()


class Mid(nn.Module):
    def __init__(self):
        super().__init__()
        self.leaf = Inner()

    def forward(self, x):
        return x


class Outer(nn.Module):
    """Calls a grandchild directly, like dsv4's attention calling self.indexer.compressor.decode."""

    def __init__(self):
        super().__init__()
        self.mid = Mid()
        self.idle = Inner()

    def forward(self, x):
        return self.mid.leaf(x)


def test_children_include_grandchildren_called_directly():
    from audit._capture_worker import _children

    o = Outer()
    with CallWatch(dict(o.named_modules(prefix="o")), record=o) as w:
        o(torch.ones(1))
    kids = _children(o, "o", w)
    assert [(k["path"], k["called"]) for k in kids] == [("o.mid", False), ("o.idle", False), ("o.mid.leaf", True)]
    assert kids[-1]["direct_call"] is True


# ---------------------------------------------------------------------- trial flow with a fake CUDA
class _FakeCuda:
    """Just enough of torch.cuda for trial_capture's control flow to run on the CPU."""

    def __init__(self, monkeypatch, eager_kernels=2, graph_kernels=2):
        import contextlib

        import audit._capture_graph as G

        self.capturing, self.on_replay, self.modes = False, None, []
        fake = self

        class Stream:
            def __init__(self, device=None):
                self.device = torch.device(device or "cuda:0")

        class Graph:
            def __init__(self, keep_graph=False):
                assert keep_graph

            def raw_cuda_graph(self):
                return 1

            def replay(self):
                fake.on_replay()

        @contextlib.contextmanager
        def graph(g, stream=None, capture_error_mode="global"):
            fake.modes.append(capture_error_mode)
            fake.capturing = True
            try:
                yield
            finally:
                fake.capturing = False

        null = lambda *a, **k: contextlib.nullcontext()  # noqa: E731
        for name, value in [("is_available", lambda: True), ("device", null), ("stream", null), ("Stream", Stream),
                            ("synchronize", lambda *a: None), ("CUDAGraph", Graph), ("graph", graph),
                            ("current_device", lambda: 0)]:
            monkeypatch.setattr(torch.cuda, name, value)
        monkeypatch.setattr(G, "graph_kernel_counts", lambda raw: {"nodes": graph_kernels, "kernels": graph_kernels,
                                                                   "types": {"kernel": graph_kernels}})
        monkeypatch.setattr(G, "count_eager_kernels", lambda fn, sync: (fn(), (eager_kernels, 0))[1])


class _Doubler:
    """fn writes 2*x into a static output, like a captured kernel; replay does what on_replay says."""

    def __init__(self):
        self.x, self.out = torch.zeros(4), torch.zeros(4)

    def feed(self, k):
        self.x.copy_(torch.arange(4.0) + k)

    def __call__(self):
        torch.mul(self.x, 2, out=self.out)
        return self.out


def test_trial_flow_pass(monkeypatch):
    from audit.capture import trial_capture

    cuda = _FakeCuda(monkeypatch)
    d = _Doubler()
    cuda.on_replay = d
    r = trial_capture(d, device="cuda:0", feed=d.feed, state={"d": d}, capture_error_mode="relaxed")
    assert r.status == "pass" and r.replay_steps == 3 and r.graph_kernels == r.eager_kernels == 2, r
    assert cuda.modes == ["relaxed"] and r.eager_spread is None


def test_trial_flow_mismatch_names_step_and_output(monkeypatch):
    from audit.capture import trial_capture

    cuda = _FakeCuda(monkeypatch)
    d = _Doubler()
    cuda.on_replay = lambda: torch.mul(torch.arange(4.0), 2, out=d.out)  # inputs baked at step 0
    r = trial_capture(d, device="cuda:0", feed=d.feed, state={"d": d})
    assert r.status == "mismatch" and r.first_diff == "step 1: out" and r.max_abs_diff == 4.0, r  # worst over steps


def test_trial_flow_uncaptured_and_empty(monkeypatch):
    from audit.capture import trial_capture

    d = _Doubler()
    _FakeCuda(monkeypatch, eager_kernels=3, graph_kernels=2).on_replay = d
    assert trial_capture(d, device="cuda:0", feed=d.feed, state={"d": d}).status == "uncaptured"
    _FakeCuda(monkeypatch, eager_kernels=3, graph_kernels=0).on_replay = d
    assert trial_capture(d, device="cuda:0", feed=d.feed, state={"d": d}).status == "empty"


def test_trial_flow_capture_failure_is_classified_and_annotated(monkeypatch):
    from audit.capture import trial_capture

    cuda = _FakeCuda(monkeypatch)

    def fn():
        if cuda.capturing:
            _user_level_failure()
        return torch.ones(1)

    seen = []
    r = trial_capture(fn, device="cuda:0", annotate=lambda e, res: seen.append(type(e).__name__))
    assert (r.status, r.phase, r.error_class) == ("fail", "capture", "unpinned-copy")
    assert r.raised_at["function"] == "_user_level_failure" and seen == ["RuntimeError"]


def test_trial_flow_eager_failure_is_an_error_not_a_verdict(monkeypatch):
    from audit.capture import trial_capture

    _FakeCuda(monkeypatch)
    r = trial_capture(lambda: 1 / 0, device="cuda:0")
    assert (r.status, r.phase, r.error_class) == ("error", "warmup", "other") and "ZeroDivisionError" in r.error


def test_trial_flow_tolerates_nondeterministic_eager(monkeypatch):
    """Atomics make eager differ from itself; replay within that spread is not a mismatch."""
    from audit.capture import trial_capture

    cuda = _FakeCuda(monkeypatch)
    d = _Doubler()
    jitter = iter([0.0, 1e-3] * 50)

    def fn():
        d()
        d.out.add_(next(jitter))
        return d.out

    cuda.on_replay = lambda: (d(), d.out.add_(5e-4))
    r = trial_capture(fn, device="cuda:0", feed=d.feed, state={"d": d})
    assert r.status == "pass" and r.eager_spread == pytest.approx(1e-3, rel=1e-2), r
    assert "not deterministic" in r.warnings[-1]


def test_worker_module_trial_flow_with_fake_cuda(monkeypatch, tmp_path):
    """The worker's whole module path (record, static args, fresh inputs, trial, result) on the CPU.
    The fake graph's replay does nothing: the ring write is missing from the restored state at step 0."""
    import audit._capture_target as T
    from audit._capture_worker import Worker

    target = tmp_path / "cpu_target.py"
    target.write_text(f"import sys\nsys.path.insert(0, {str(PLANTED)!r})\n"
                      "from baked_pos import RingWriter\nfrom planted_common import D, Target\n"
                      "def make(device):\n    return Target('cpu', ('writer', RingWriter(D)))\n")
    cuda = _FakeCuda(monkeypatch)
    cuda.on_replay = lambda: None
    monkeypatch.setattr(T, "module_device", lambda m: None)
    w = Worker({"target": f"{target}:make", "device": "cuda:0", "target_warmup": 1})
    w.start()
    writer = w.obj.model.layers[1].writer
    pos = writer.pos
    r = w.capture("model.layers.1.writer")
    assert r.status == "mismatch" and r.first_diff == "step 0: state model.layers.1.writer.ring", r
    assert r.module_type == "RingWriter" and r.source["function"] == "forward" and r.children == []
    assert r.graph_kernels == r.eager_kernels == 2 and cuda.modes == ["global"]
    assert writer.pos == pos  # rolled back after the trial
    step = w.capture(None)
    assert step.status == "mismatch" and step.module_type == "Target" and step.source["function"] == "step"


def test_pool_retries_an_unexplained_failure_in_a_fresh_worker(monkeypatch):
    from audit._capture_pool import CapturePool

    pool = CapturePool({"target": "dsv4:tiny", "device": "cuda:0"})
    answers = iter([CaptureResult(path="m", status="fail", error_class="other", error="weird"),
                    CaptureResult(path="m", status="pass")])
    monkeypatch.setattr(pool, "_capture_once", lambda module: next(answers))
    pool.proc = type("P", (), {"poll": lambda self: None})()
    pool.served = 3
    r = pool.capture("m")
    assert r.status == "pass" and "re-tried in a fresh worker" in r.warnings[0]
    pool.proc = None
    sync_fail = CaptureResult(path="m", status="fail", error_class="sync-during-capture")
    monkeypatch.setattr(pool, "_capture_once", lambda module: sync_fail)
    assert pool.capture("m") is sync_fail  # the program's own failure: no retry


def test_trial_warns_about_a_stream_of_another_device(monkeypatch):
    from audit.capture import trial_capture

    _FakeCuda(monkeypatch).on_replay = lambda: None

    class Elsewhere:
        device = torch.device("cuda", 1)

    with pytest.warns(RuntimeWarning, match="capture stream is on cuda:1"):
        r = trial_capture(lambda: None, device="cuda:0", stream=Elsewhere())
    assert r.stream_device == "cuda:1" and "capture stream is on cuda:1" in r.warnings[0]
