"""An end torch derives from its own read of a 0-dim device start is the host-sync's, not a baked host value
(audit/detectors/tensors/read_values.py).

`cache.narrow(1, pos, n)` with `pos` a 0-dim device tensor (an int8 KV cache written at a device position) reads
`pos` inside the composite and slices `[pos, pos + n)`: the start is the read value and the end follows it by
the same length in every step. One finding, the host-sync; no baked-host-value beside it. Slice bounds the code
writes (`cache[:, pos:end]`, `end` a host counter) are read through `__index__` and stay the code's own values.
"""

from __future__ import annotations

import random

from site_util import one_read, write_target

TEMPLATE = """
import torch


class Step:
    def __init__(self, device):
        self.k = torch.zeros({h}, {t}, {d}, device=device)
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        self.end = {n}
        self.x = torch.zeros({h}, {n}, {d}, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn({h}, {n}, {d}))

    @torch.no_grad()
    def step(self):
        {write}  # SITE
        self.pos.add_({n})
        self.end += {n}
        return self.k.sum()


def make(device):
    return Step(device)
"""


def _target(tmp_path, write):
    h, n, d = random.randint(1, 3), random.randint(1, 3), random.randint(2, 6)
    return write_target(tmp_path / f"narrow_{random.randrange(10**6)}.py", TEMPLATE, h=h, n=n, d=d,
                        t=n * 8 + random.randint(0, 5), write=write.format(n=n))


def test_narrow_end_follows_torchs_read(tmp_path):
    write = random.choice(["self.k.narrow(1, self.pos, {n}).copy_(self.x)",
                           "torch.narrow(self.k, 1, self.pos, {n}).copy_(self.x)"])
    path, site = _target(tmp_path, write)
    one_read(path, site, baked=False)


def test_code_written_end_stays_baked(tmp_path):
    path, site = _target(tmp_path, "self.k[:, self.pos:self.end].copy_(self.x)")
    one_read(path, site, baked=True)
