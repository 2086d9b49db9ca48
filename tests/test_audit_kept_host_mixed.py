"""A host tensor the class keeps, combined in the step with a host factory's tensor, then sent to the device.

A scheduler keeps per-row lengths in host memory (`self.lens_cpu = torch.zeros(b, dtype=torch.long)`, beside
buffers it puts on the device) and rebuilds the attention mask each step from a host arange:
`(torch.arange(n)[None] < self.lens_cpu[:, None]).to(x.device)`. The mask is computed from host memory alone,
so its `.to()` is a copy from pageable memory (capture raises), though one operand was made in the step and the
other kept by the class. Built from device lengths on the device it is clean; read back on the host it is too.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch


class Masker:
    def __init__(self, b, n, device):
        self.lens_cpu = torch.zeros(b, dtype=torch.long)
        self.lens_dev = torch.zeros(b, dtype=torch.long, device=device)
        self.n = n

    def __call__(self, x):
        {body}  # LIBSITE
        return x * (1.0 + 0.01 * m.float().sum())
"""

CMP = ["torch.arange(self.n)[None, :] < {lens}[:, None]", "torch.lt(torch.arange(self.n)[None, :], {lens}[:, None])",
       "{lens}[:, None].gt(torch.arange(self.n).unsqueeze(0))"]
BODIES = {
    "hit": "m = ({cmp}).to(x.device)",
    "device": "m = ({cmp_dev})",
    "host_read": "assert int(({cmp}).sum()) >= 0; m = torch.zeros(1, device=x.device)",
}


@pytest.mark.parametrize("kind", ["hit", "device", "host_read"])
def test_kept_host_lengths_mask(tmp_path, monkeypatch, kind):
    cmp = random.choice(CMP)
    body = BODIES[kind].format(cmp=cmp.format(lens="self.lens_cpu"),
                               cmp_dev=cmp.format(lens="self.lens_dev").replace("torch.arange(self.n)",
                                                                               "torch.arange(self.n, device=x.device)"))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB.format(body=body), "keptmix", "Masker",
                                          "self.mk(self.x @ self.w)",
                                          init=f"        self.mk = Masker({random.randint(1, 3)}, {random.randint(2, 6)}, self.x.device)",
                                          prepare="        self.mk.lens_cpu.fill_(i % 3)\n        self.mk.lens_dev.fill_(i % 3)")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "hit" if kind == "hit" else "clean", "pageable-copy", lib, path, site)
