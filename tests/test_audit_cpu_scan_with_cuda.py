"""A CPU scan on a machine that has CUDA reports what a CPU-only machine reports.

Streams, events and pinned buffers a step written for the GPU makes get the scan's host stand-ins whether or
not the machine could make real ones: a real CUDA event recorded around CPU work never completes
(`elapsed_time` raises), `record_stream` has no CPU kernel, and memory pinned for real hides the
pinned-on-request bookkeeping the detectors read. Here the machine's answers are faked (`is_available()`
says True on this CPU-only torch, with one device); the scan must not reach for a real stream, event or pinned page, and its findings
must be those of the plain CPU scan.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import audit

PLANTED = Path(__file__).parent / "planted"
# planted steps with streams and events made in make(), waits, pinned staging buffers (none asks the machine)
NAMES = ["streams_cached", "cuda_wait", "control_slices", "host_sync", "host_state_stdlib", "host_reads_aliased"]


def _rows(name: str, seed: int) -> list:
    torch.manual_seed(seed)  # the planted steps draw their phases from the global generator
    inv = audit.scan(f"{PLANTED / name}.py:make", device="cpu")
    return sorted((f["category"], f["file"].rsplit("/", 1)[-1], f["line"], f["severity"]) for f in inv.findings())


@pytest.mark.skipif(torch.cuda.is_available(), reason="fakes a CUDA machine on a CPU-only torch")
@pytest.mark.parametrize("name", NAMES)
def test_cpu_scan_is_the_same_on_a_machine_with_cuda(name, monkeypatch, rng):
    seed = int(torch.randint(0, 2**31, (1,), generator=rng))
    plain = _rows(name, seed)
    for query, answer in (("is_available", True), ("device_count", 1), ("current_device", 0)):  # one GPU
        monkeypatch.setattr(torch.cuda, query, lambda *a, answer=answer, **k: answer)
    assert _rows(name, seed) == plain
