"""GPU scan of a tensor subclass whose `__torch_dispatch__` moves a host table to the device: the finding is the
library's copy line (pageable-copy), with the target's call as its caller, and no host-sync at the caller's line.

Torch holds the copy's sync-debug warning until the outer call returns to Python, so the warning surfaces at
the target's line; the scan hands it back to the nested copy (audit/detectors/runtime_syncs.py).

Run: pytest -q -m gpu tests/test_audit_subclass_copies_gpu.py   (skipped without CUDA)
"""

from __future__ import annotations

import random
import sys
import textwrap

import pytest

import audit

pytestmark = pytest.mark.gpu

LIB = '''
import torch
from torch.utils._pytree import tree_map


class TableWeight(torch.Tensor):
    @staticmethod
    def __new__(cls, codes, table, shape):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32, device=codes.device)

    def __init__(self, codes, table, shape):
        self.codes = codes  # indices on the device
        self.table = table  # values kept in host memory

    def __tensor_flatten__(self):
        return ["codes", "table"], None

    def expand(self):
        lut = self.table.to(self.codes.device)  # COPY
        return lut[self.codes]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def plain(t):
            return t.expand() if isinstance(t, TableWeight) else t
        return func(*tree_map(plain, args), **tree_map(plain, kwargs or {}))
'''

TARGET = '''
import torch
from {lib} import TableWeight


class Step:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        codes = torch.randint(0, {levels}, ({n}, {k}), generator=g).to(device)
        self.w = TableWeight(codes, torch.randn({levels}, generator=g), ({n}, {k}))
        self.x = torch.randn(2, {k}, generator=g).to(device)
        self.out = torch.zeros(2, {n}, device=device)

    def prepare(self, i):
        self.x.normal_()

    def step(self):
        self.out.copy_(torch.nn.functional.linear(self.x, self.w))  # CALL


def make(device):
    return Step(device)
'''


def _line(text: str, mark: str) -> int:
    return next(i for i, s in enumerate(text.splitlines(), 1) if s.rstrip().endswith(mark))


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_subclass_dispatch_copy_is_the_librarys_line(tmp_path):
    lib = f"tablelib_{random.randrange(10**6)}"
    site, own = tmp_path / "site", tmp_path / "target"
    site.mkdir(), own.mkdir()
    lib_src = textwrap.dedent(LIB)
    tgt_src = textwrap.dedent(TARGET).format(lib=lib, seed=random.randrange(10**6), levels=random.choice((4, 16)),
                                             n=random.randrange(8, 64), k=random.randrange(8, 64))
    (site / f"{lib}.py").write_text(lib_src)
    (own / "step.py").write_text(tgt_src)
    sys.path.insert(0, str(site))
    try:
        inv = audit.scan(f"{own / 'step.py'}:make", device="cuda")
    finally:
        sys.path.remove(str(site))
    rows = [(f["category"], f["file"].rsplit("/", 1)[-1], f["line"], f.get("caller_line")) for f in inv.findings()
            if f["severity"] != "info"]
    copy, call = _line(lib_src, "# COPY"), _line(tgt_src, "# CALL")
    assert ("pageable-copy", f"{lib}.py", copy, call) in rows, rows
    assert not [r for r in rows if r[0] == "host-sync"], rows
