"""Device queries in a step written for the GPU, on a CPU scan (audit/scan/standins/cpu_queries.py).

A Triton-style kernel wrapper asks about the device at every call: `with torch.cuda.device(x.device):`,
`torch.cuda.current_device()`, `torch.cuda.get_device_capability()`, `get_device_properties(d)` for the
multiprocessor count. On a GPU that is host-side driver state (no finding); a CPU-only torch raised, and the
scan stopped at that line. Now they answer as a GPU would, the clean wrapper scans clean, and a read planted
behind them is found at its own line with the target's call as caller.
"""

from __future__ import annotations

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch

_WORKSPACE = {}


def launch(x, read):
    with torch.cuda.device(x.device):
        dev = torch.cuda.current_device()
        major, _ = torch.cuda.get_device_capability(dev)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        name = torch.cuda.get_device_name(dev)
        if dev not in _WORKSPACE:
            _WORKSPACE[dev] = torch.zeros(1, device=x.device)
        y = x * (2.0 if major >= 8 and sms > 0 and name else 1.0) + _WORKSPACE[dev]
        if read:
            return y * float(y.sum().item() != 0.0)  # LIBSITE
        return y
"""


@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_device_queries_answer_on_a_cpu_scan(tmp_path, monkeypatch, kind):
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB, "devq", "launch",
                                          f"launch(torch.tanh(self.x @ self.w), {kind == 'hit'})")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "host-sync", lib, path, site)
