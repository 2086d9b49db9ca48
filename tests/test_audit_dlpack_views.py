"""DLPack in the step: `torch.from_dlpack` over a torch tensor's own memory is a view of it, not host data.

Code that hands an activation to another framework and back (`torch.from_dlpack(to_dlpack(h))`, or
`torch.from_dlpack(h)` through `h.__dlpack__()`) gets the same device memory back, zero-copy: nothing is
baked and nothing crosses to the host. Only over host memory (a numpy array filled in prepare()) is the
result host data, whose upload in the step is a pageable copy."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, matmul_target, table, write_target

ROUND_TRIPS = {
    "capsule": "torch.from_dlpack(to_dlpack(h))",
    "capsule, module path": "torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(h))",
    "protocol": "torch.from_dlpack(h)",
    "dunder capsule": "torch.from_dlpack(h.__dlpack__())",
}


@pytest.mark.parametrize("how", sorted(ROUND_TRIPS))
def test_a_dlpack_round_trip_of_a_step_tensor_is_clean(tmp_path, how):
    scale = round(random.uniform(0.5, 2.0), 3)
    step = (f"        h = torch.tanh(self.x @ self.w)\n"
            f"        g = {ROUND_TRIPS[how]}  # SITE\n"
            f"        self.out.copy_(g * {scale} + h)")
    tpl = matmul_target(step, imports="import torch.utils.dlpack\nfrom torch.utils.dlpack import to_dlpack")
    path, _ = write_target(tmp_path / "dl_roundtrip.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    assert not len(bad), table(bad)


def test_dlpack_over_a_host_array_sent_to_the_device_is_still_a_pageable_copy(tmp_path):
    d = random.choice([4, 8])
    step = ("        m = torch.from_dlpack(self.mask).to(self.x.device)  # SITE\n"
            "        self.out.copy_((self.x @ self.w) * m)")
    tpl = matmul_target(step, imports="import numpy as np", init=f"        self.mask = np.ones({d}, dtype=np.float32)",
                        prepare=f"        self.mask[:] = np.random.default_rng(i).random({d}, dtype=np.float32)")
    path, site = write_target(tmp_path / "dl_host.py", tpl, seed=random.randrange(2**31), d=d)
    bad = blocking(path)
    assert len(at(bad, "pageable-copy", site)) == 1, table(bad)
