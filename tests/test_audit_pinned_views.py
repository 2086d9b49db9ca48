"""A pinned staging buffer wrapped again in the step through its numpy view is the pinned buffer.

Batch builders keep a numpy view of a pinned tensor (`self.stage_np = self.stage.numpy()`), write it in
prepare() and upload `torch.from_numpy(self.stage_np)` (or `torch.as_tensor` of it, zero-copy) with `non_blocking=True` in the step. On a GPU the new
tensor's `is_pinned()` asks the driver about its address, so the upload is the pinned copy a captured memcpy
node repeats on replay, reading what prepare() wrote: no pageable copy, nothing baked. The same code over an
ordinary numpy array is host data sent to the device (the hit twin)."""

from __future__ import annotations

import random

import pytest
import torch

from site_util import SEEDED_TARGET, at, blocking, table, write_target

WRAPS = {
    "from_numpy": "torch.from_numpy(self.stage_np{cut})",
    "frombuffer": "torch.frombuffer(self.stage_np{cut}, dtype=torch.float32)",
    "from_dlpack": "torch.from_dlpack(self.stage_np{cut})",
    "as_tensor": "torch.as_tensor(self.stage_np{cut})",
    "asarray": "torch.asarray(self.stage_np{cut})",
}
TEMPLATE = """
import numpy as np
import torch


""" + SEEDED_TARGET + """{init}

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
{prepare}

    def step(self):
{step}


def make(device):
    return Target(device)
"""
SENDS = {
    "to": "        y = {wrap}.to(self.x.device, non_blocking=True)  # SITE\n        self.out.copy_(self.x @ self.w + y.sum())",
    "copy_": "        self.dev.copy_({wrap}, non_blocking=True)  # SITE\n        self.out.copy_(self.x @ self.w + self.dev.sum())",
}


@pytest.mark.parametrize("kind", ["clean", "hit"])
@pytest.mark.parametrize("wrap", sorted(WRAPS))
def test_numpy_view_of_a_pinned_buffer_uploaded_in_the_step(tmp_path, kind, wrap):
    d = random.choice([4, 8])
    n = random.choice([d, d // 2])  # the whole view or its head (an offset of zero, a shorter span)
    cut = "" if n == d else f"[:{n}]"
    send = random.choice(sorted(SENDS))
    pin = random.choice(["True", "torch.cuda.is_available()"])
    made = (f"torch.zeros({d}, pin_memory={pin}).numpy()" if kind == "clean"
            else f"np.zeros({d}, dtype=np.float32)")
    init = (f"        self.stage_np = {made}\n"
            f"        self.dev = torch.zeros({n}, device=self.x.device)")
    prepare = f"        self.stage_np[:] = np.random.default_rng(i).random({d}, dtype=np.float32)"
    step = SENDS[send].format(wrap=WRAPS[wrap].format(cut=cut))
    path, site = write_target(tmp_path / "pinned_view.py", TEMPLATE, seed=random.randrange(2**31), d=d,
                              init=init, prepare=prepare, step=step)
    bad = blocking(path)
    if kind == "clean":
        assert not len(bad), table(bad)
    else:
        assert len(at(bad, "pageable-copy", site)) == 1, table(bad)


def _kept_view_target(tmp_path, pin: str):
    """A kept host tensor uploaded in the step through its numpy view (`torch.from_numpy(self.stage_np)`)."""
    d = random.choice([4, 8])
    n = random.choice([d, d // 2])
    cut = "" if n == d else f"[:{n}]"
    init = (f"        self.stage = torch.zeros({d}, pin_memory={pin})\n"
            f"        self.stage_np = self.stage.numpy()\n"
            f"        self.dev = torch.zeros({n}, device=self.x.device)")
    prepare = f"        self.stage_np[:] = np.random.default_rng(i).random({d}, dtype=np.float32)"
    step = SENDS[random.choice(sorted(SENDS))].format(wrap=WRAPS[random.choice(sorted(WRAPS))].format(cut=cut))
    return write_target(tmp_path / "kept_view.py", TEMPLATE, seed=random.randrange(2**31), d=d, init=init,
                        prepare=prepare, step=step)


def test_numpy_view_of_a_pageable_kept_tensor_is_that_tensor(tmp_path):
    """Reached through `tensor.numpy()`'s base, a pageable kept tensor's upload is its pageable copy, no host
    value made in the step (nothing baked)."""
    path, site = _kept_view_target(tmp_path, "False")
    bad = blocking(path)
    assert len(at(bad, "pageable-copy", site)) == 1, table(bad)
    assert not len(at(bad, "baked-host-value", site)), table(bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_numpy_view_of_a_pinned_buffer_on_a_cuda_scan(tmp_path):
    """On a GPU the buffer is really pinned (no stand-in records it): found through the numpy view's base."""
    import audit

    path, site = _kept_view_target(tmp_path, "True")
    bad = audit.scan(f"{path}:make", device="cuda").blocking()
    assert not len(bad), table(bad)
