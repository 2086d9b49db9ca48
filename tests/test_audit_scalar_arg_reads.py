"""A float torch reads from a 0-dim device tensor passed where a Scalar goes is the host-sync's, not a baked host
value (audit/detectors/tensors/read_values.py).

`torch.full_like(x[:, :1], amax / 127)` (a per-row scale buffer from a dynamic activation amax) or
`torch.add(x, y, alpha=t)` makes torch's argument parsing read the tensor back and hand the op that float, which
changes with the data every step: one finding, the host-sync at that line. The code's own read
(`float(amax) / 127`) is a Python value of its own and stays baked beside its read.
"""

from __future__ import annotations

import random

import pytest

from site_util import one_read, write_target

TEMPLATE = """
import torch


class Step:
    def __init__(self, device):
        self.x = torch.zeros({b}, {d}, device=device)
        self.y = torch.zeros({b}, {d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {d}) * (1 + i))
        self.y.copy_(torch.randn({b}, {d}))

    @torch.no_grad()
    def step(self):
        amax = self.x.abs().amax().clamp(min=1e-6)
        out = {call}  # SITE
        return out.sum()


def make(device):
    return Step(device)
"""

TORCH_READS = ["torch.full_like(self.x[:, :1], amax / 127)", "torch.full(({b}, 1), amax / 127, device=self.x.device)",
               "torch.add(self.x, self.y, alpha=amax / 127)"]


def _target(tmp_path, call):
    b, d = random.randint(1, 4), random.randint(2, 9)
    return write_target(tmp_path / f"scalar_{random.randrange(10**6)}.py", TEMPLATE, b=b, d=d,
                        call=call.format(b=b))


@pytest.mark.parametrize("call", TORCH_READS)
def test_scalar_torch_reads_is_the_host_syncs(tmp_path, call):
    path, site = _target(tmp_path, call)
    one_read(path, site, baked=False)


def test_code_read_float_stays_baked(tmp_path):
    path, site = _target(tmp_path, "torch.full_like(self.x[:, :1], float(amax) / 127)")
    one_read(path, site, baked=True)
