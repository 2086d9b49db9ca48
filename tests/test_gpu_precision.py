"""On a GPU (issue 14, points 3 and 5): `scan --device cuda` over the planted suite puts no
finding off its plants and misses nothing the CPU scan finds; one device->host read is one
finding; a sync lands on the line that synchronized; unjoined streams are found at their lines;
a trial capture of an unforked block names the line of the first kernel missing from the graph.

Run: pytest -q -m gpu tests/test_gpu_precision.py   (skipped without CUDA)
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

import audit

pytestmark = pytest.mark.gpu

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "planted_gpu"))
import gpu_precision  # noqa: E402
from markers import found, markers  # noqa: E402

STREAMS = HERE / "planted_gpu" / "streams.py"
WAITS = HERE / "planted_gpu" / "cuda_waits.py"


@pytest.fixture(scope="module")
def suite():
    """Measured once for the module; with GPU_PRECISION_JSON set (tests/gpu_audit.sh) the table is
    printed and the rows written there, so the slice measures the suite once."""
    rows = gpu_precision.measure_all(progress=True)
    if os.environ.get("GPU_PRECISION_JSON"):
        gpu_precision.report(rows, os.environ["GPU_PRECISION_JSON"])
    return rows


def test_no_cuda_finding_off_the_plants(suite):
    off = [(r["target"], o) for r in suite for o in r["cuda"]["off_plant"]]
    assert not off, "\n".join(f"{t}: {o}" for t, o in off)


def test_the_cuda_scan_finds_what_the_cpu_scan_finds(suite):
    """Judged on targets that run on CUDA; a planted file whose own code is CPU-only (a CPU index
    into a CUDA tensor) stops early there, which is printed, not counted."""
    ran = [r for r in suite if not r["cuda"]["error"]]
    print("\n".join(f"cannot run on cuda: {r['target']}: {r['cuda']['error']}" for r in suite if r["cuda"]["error"]))
    assert len(ran) >= 20
    missed = [(r["target"], r["missed_on_cuda"]) for r in ran if r["missed_on_cuda"]]
    assert not missed, missed


@pytest.mark.parametrize("factory", ["make", "make_no_join", "make_event_no_join", "make_no_wait"])
def test_unjoined_streams_on_cuda(factory):
    import inspect

    import streams as mod

    src, lo = inspect.getsourcelines(type(getattr(mod, factory)("cpu")).step)
    inv = audit.scan(f"{STREAMS}:{factory}", device="cuda")
    assert found(inv, STREAMS) == {(n, c) for n, c in markers(STREAMS) if lo <= n < lo + len(src)}


@pytest.mark.parametrize("target", [f"{STREAMS}:make_clean", f"{STREAMS}:make_clean_events",
                                    f"{WAITS}:make_clean", f"{WAITS}:make_first_call_only"])
def test_legal_streams_and_events_give_no_finding_on_cuda(target):
    inv = audit.scan(target, device="cuda")
    assert inv.blocking().empty, inv.df[["line", "category", "op", "message"]].to_string()


def test_cuda_waits_on_cuda():
    assert found(audit.scan(f"{WAITS}:make", device="cuda"), WAITS) == markers(WAITS)


def _target(tmp_path, body: str) -> tuple[str, Path]:
    path = tmp_path / "t.py"
    path.write_text(textwrap.dedent(f"""
        import torch

        class T:
            def __init__(self, device):
                self.x = torch.zeros(8, device=device)
                self.a = torch.zeros(4, 4, device=device)

            def prepare(self, i):
                self.x.copy_(torch.randn(8))
                self.a.copy_(torch.randn(4, 4) + 4 * torch.eye(4))

            def step(self):
    """) + textwrap.indent(textwrap.dedent(body), " " * 8) + "\ndef make(device):\n    return T(device)\n")
    return f"{path}:make", path


def _line(path: Path, tag: str) -> int:
    return next(n for n, t in enumerate(path.read_text().splitlines(), 1) if tag in t)


def test_one_tolist_is_one_host_sync_finding(tmp_path):
    spec, path = _target(tmp_path, """
        vals = self.x.tolist()  # READ
        return self.x * len(vals)
    """)
    inv = audit.scan(spec, device="cuda")
    bad = inv.df[inv.df.severity != "info"]
    assert list(zip(bad.line, bad.category)) == [(_line(path, "# READ"), "host-sync")], bad.to_string()
    assert "pageable" in bad.message.iloc[0]


def test_a_sync_is_reported_on_the_line_that_synchronized(tmp_path):
    spec, path = _target(tmp_path, """
        inv = torch.linalg.inv(self.a)  # SYNC
        y = self.x * 2
        z = y + inv.sum()
        return z
    """)
    inv = audit.scan(spec, device="cuda")
    sync = inv.where("host-sync")
    assert set(sync.line) == {_line(path, "# SYNC")}, sync[["line", "op", "message"]].to_string()


def test_trial_capture_of_an_unforked_block_names_the_first_missing_kernel():
    from audit.capture.trial import capture_callable

    import streams as mod

    t = mod.make_no_wait("cuda")
    t.prepare(0)
    r = capture_callable(t.step, capture_error_mode="relaxed")  # the side block allocates while capturing
    assert r.status == "uncaptured" and r.graph_kernels < r.eager_kernels, (r.status, r.error, r.missing_at)
    tanh = _line(STREAMS, "y = torch.tanh(h) * 3")
    assert r.missing_at and r.missing_at.get("line") == tanh, r.missing_at
