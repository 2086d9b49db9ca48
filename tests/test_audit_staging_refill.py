"""A pinned staging buffer refilled through a numpy view inside the step (audit/detectors/staging_refill.py).

`self.cpu.numpy()[:] = lens` writes host memory with no torch op, so the trace shows nothing; inside a graph
it runs once, at capture, and every replay uploads the captured bytes. The bytes of pinned buffers are
hashed around each step (audit/scan/snapshot/staging_bytes.py); the writing statement is a cpu-side-effect, in a
library too, with the target's call as caller. The same refill in prepare() is the legal form: no finding.
"""

from __future__ import annotations

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import numpy as np
import torch


class Staging:
    def __init__(self, n, device):
        self.cpu = torch.zeros(n, dtype=torch.long, pin_memory=True)
        self.gpu = torch.zeros(n, dtype=torch.long, device=device)

    def refill_slice(self, vals):
        self.cpu.numpy()[:] = vals  # LIB_slice

    def refill_copyto(self, vals):
        np.copyto(self.cpu.numpy(), np.asarray(vals, dtype=np.int64))  # LIB_copyto

    def refill_alias(self, vals):
        view = self.cpu.numpy()
        view[: len(vals)] = vals  # LIB_alias

    def upload(self):
        self.gpu.copy_(self.cpu, non_blocking=True)
        return self.gpu


def refill_and_upload(st, vals, how):
    getattr(st, f"refill_{how}")(vals)
    return st.upload()
"""

VALS = "[random.randrange(1, 99) for _ in range({d})]"


@pytest.mark.parametrize("how", ["slice", "copyto", "alias"])
@pytest.mark.parametrize("where", ["step", "prepare"])
def test_a_numpy_refill_of_a_pinned_buffer(tmp_path, monkeypatch, how, where):
    call = f"refill_and_upload(self.st, {VALS}, '{how}')" if where == "step" else "self.st.upload()"
    prep = "" if where == "step" else f"        self.st.refill_{how}({VALS})"
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, LIB, "refill", "Staging, refill_and_upload\nimport random", f"{call}.float() * self.x",
        init="        self.st = Staging({d}, self.x.device)", prepare=prep)
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "hit" if where == "step" else "clean", "cpu-side-effect", lib, path, site, marker=f"# LIB_{how}")
