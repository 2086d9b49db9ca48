"""Trial capture flow against a fake CUDA: pass, mismatch, uncaptured, failures, retries."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from audit.capture.trial import CaptureResult
from capture_util import _user_level_failure

PLANTED = Path(__file__).parent / "planted_gpu"
sys.path.insert(0, str(PLANTED))

# ---------------------------------------------------------------------- trial flow with a fake CUDA
class _FakeCuda:
    """Just enough of torch.cuda for trial_capture's control flow to run on the CPU."""

    def __init__(self, monkeypatch, eager_kernels=2, graph_kernels=2):
        import contextlib

        import audit.capture.graph as G

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
    from audit.capture.trial import trial_capture

    cuda = _FakeCuda(monkeypatch)
    d = _Doubler()
    cuda.on_replay = d
    r = trial_capture(d, device="cuda:0", feed=d.feed, state={"d": d}, capture_error_mode="relaxed")
    assert r.status == "pass" and r.replay_steps == 3 and r.graph_kernels == r.eager_kernels == 2, r
    assert cuda.modes == ["relaxed"] and r.eager_spread is None


def test_trial_flow_mismatch_names_step_and_output(monkeypatch):
    from audit.capture.trial import trial_capture

    cuda = _FakeCuda(monkeypatch)
    d = _Doubler()
    cuda.on_replay = lambda: torch.mul(torch.arange(4.0), 2, out=d.out)  # inputs baked at step 0
    r = trial_capture(d, device="cuda:0", feed=d.feed, state={"d": d})
    assert r.status == "mismatch" and r.first_diff == "step 1: out" and r.max_abs_diff == 4.0, r  # worst over steps


def test_trial_flow_uncaptured_and_empty(monkeypatch):
    from audit.capture.trial import trial_capture

    d = _Doubler()
    _FakeCuda(monkeypatch, eager_kernels=3, graph_kernels=2).on_replay = d
    assert trial_capture(d, device="cuda:0", feed=d.feed, state={"d": d}).status == "uncaptured"
    _FakeCuda(monkeypatch, eager_kernels=3, graph_kernels=0).on_replay = d
    assert trial_capture(d, device="cuda:0", feed=d.feed, state={"d": d}).status == "empty"


def test_trial_flow_capture_failure_is_classified_and_annotated(monkeypatch):
    from audit.capture.trial import trial_capture

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
    from audit.capture.trial import trial_capture

    _FakeCuda(monkeypatch)
    r = trial_capture(lambda: 1 / 0, device="cuda:0")
    assert (r.status, r.phase, r.error_class) == ("error", "warmup", "other") and "ZeroDivisionError" in r.error


def test_trial_flow_tolerates_nondeterministic_eager(monkeypatch):
    """Atomics make eager differ from itself; replay within that spread is not a mismatch."""
    from audit.capture.trial import trial_capture

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
    import audit.capture.modules as T
    from audit.capture.worker import Worker

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
    from audit.capture.pool import CapturePool

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
    from audit.capture.trial import trial_capture

    _FakeCuda(monkeypatch).on_replay = lambda: None

    class Elsewhere:
        device = torch.device("cuda", 1)

    with pytest.warns(RuntimeWarning, match="capture stream is on cuda:1"):
        r = trial_capture(lambda: None, device="cuda:0", stream=Elsewhere())
    assert r.stream_device == "cuda:1" and "capture stream is on cuda:1" in r.warnings[0]
