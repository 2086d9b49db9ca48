"""Composite ops on nested tensors run as themselves under the tracer (`audit/scan/composites.py`).

Attention on a jagged nested tensor falls back, where no fused kernel takes it (on a CPU), to torch's math path on
strided nested tensors, whose `matmul` reaches the tracer's mode whole; its decomposition has no sizes for the ragged
dimension, and the scan used to stop there with the target's step "raising". The step now scans: the fallback's reads
of the offsets (a GPU's flash path reads `max_seqlen` with `.item()` instead) are one host-sync at the attention's
line. The same attention on a padded batch with a length mask is clean. Sizes and names are drawn fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch
import torch.nn.functional as F


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.lens = torch.tensor({lens}, device=device)
        self.offsets = F.pad(torch.cumsum(self.lens, 0), (1, 0))
        self.values = torch.zeros({total}, {h}, {d}, device=device)
        self.padded = torch.zeros({b}, {h}, {n}, {d}, device=device)
        self.keep = torch.arange({n}, device=device)[None, :] < self.lens[:, None]
        self.out = torch.zeros({b}, {h}, {d}, device=device)

    def prepare(self, i):
        self.values.copy_(torch.randn({total}, {h}, {d}))
        self.padded.copy_(torch.randn({b}, {h}, {n}, {d}))

    @torch.no_grad()
    def step(self):
{body}
        return self.out


def make(device):
    return Target(device)
"""

JAGGED = """        {q} = torch.nested.nested_tensor_from_jagged(self.values, self.offsets).transpose(1, 2)
        att = F.scaled_dot_product_attention({q}, {q}, {q})  # SITE
        self.out.copy_(torch.stack([t.sum(1) for t in att.unbind()]))"""
PADDED = """        {q} = self.padded
        att = F.scaled_dot_product_attention({q}, {q}, {q}, attn_mask=self.keep[:, None, None, :])  # SITE
        self.out.copy_(att.sum(2))"""


@pytest.mark.parametrize("kind", ["jagged", "padded"])
def test_attention_on_a_jagged_batch(tmp_path, kind):
    b, n = random.choice([2, 3]), random.choice([4, 5, 6])
    lens = [random.randint(1, n) for _ in range(b)]
    body = (JAGGED if kind == "jagged" else PADDED).format(q=random.choice(["q", "x", "h"]))
    path, site = write_target(tmp_path / "jagged_attention.py", TEMPLATE, seed=random.randrange(2**31), b=b, n=n,
                              h=random.choice([1, 2]), d=random.choice([4, 8]), lens=repr(lens), total=sum(lens),
                              body=body)
    bad = blocking(path)
    if kind == "padded":
        assert not len(bad), table(bad)
        return
    assert list(at(bad, "host-sync", site).line) == [site], table(bad)
