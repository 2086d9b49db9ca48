"""`torch._grouped_mm` off its fast path reads its group offsets back on a GPU.

A MoE library sorts a step's tokens by expert, counts them with `histc` (fixed bins: no read) and runs one
grouped GEMM over the experts with `offs=cumsum(counts)`, as transformers' default experts do. On a GPU the
op's fast kernel takes bf16 operands only; in float32 (or float16) torch's fallback copies `offs` to the host.
The CPU scan reports that at the library's `_grouped_mm` line, with the target's call as caller; the same
library in bf16 is clean.
"""

from __future__ import annotations

import random

import pytest
import torch

from site_util import blocking, clean_or_hit, library_target

pytestmark = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch without _grouped_mm")

LIB = """
import torch

E, W = {e}, 16  # W: a width whose rows are 16-byte aligned in bf16, as the fast kernel needs


class GroupedExperts(torch.nn.Module):
    def __init__(self, d, dtype):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(E, W, W).to(dtype) * 0.1, requires_grad=False)
        self.dtype, self.d = dtype, d

    def forward(self, x, expert_ids):
        order = torch.argsort(expert_ids, stable=True)
        counts = torch.histc(expert_ids.float(), bins=E, min=0, max=E - 1)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xs = torch.nn.functional.pad(x[order], (0, W - self.d)).to(self.dtype)
        y = torch._grouped_mm(xs, self.w, offs=offs)  # LIBSITE
        return torch.zeros_like(x).index_copy(0, order, y[:, :self.d].to(x.dtype))
"""


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_grouped_mm_fallback(tmp_path, monkeypatch, dtype):
    src = LIB.format(e=random.choice([2, 4]))
    call = "self.experts(self.x @ self.w, (self.x[:, 0] > 0).long())"
    mod, lib, path, site = library_target(
        tmp_path, monkeypatch, src, "gmm", "GroupedExperts", call,
        init=f"        self.experts = GroupedExperts(self.w.shape[0], torch.{dtype})")
    bad = blocking(path, forget=mod)
    hit = clean_or_hit(bad, "clean" if dtype == "bfloat16" else "hit", "host-sync", lib, path, site)
    if hit is not None:
        assert dtype in hit.iloc[0].message, hit.iloc[0].message
