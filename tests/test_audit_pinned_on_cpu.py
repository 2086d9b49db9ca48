"""A target that stages through pinned host buffers (`pin_memory=True`, `.pin_memory()`) scans on a
CPU-only torch. Pinned memory needs an accelerator's driver, so building such a target used to fail
("this target needs CUDA to be built"); serving code makes its staging buffers that way in __init__.
The CPU scan builds them in ordinary memory; the source still says pinned, which the copy rules read:
refilled and uploaded in prepare() is clean, refilled from Python data inside the step is reported."""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

TARGET = """
import torch


class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {d}).to(device)
        self.host = {pinned}
        self.ids = torch.zeros({b}, dtype=torch.long, device=device)
        self.pending = [0] * {b}
        self.out = torch.zeros({b}, {d}, device=device)

    def prepare(self, i):
        self.pending = [(i * 7 + j) % {d} for j in range({b})]
        {prep}

    @torch.no_grad()
    def step(self):
        {inside}
        self.out.copy_(self.w[self.ids])
        return self.out

def make(device):
    return Target(device)
"""

PINNED = ["torch.zeros({b}, dtype=torch.long, pin_memory=True)", "torch.zeros({b}, dtype=torch.long).pin_memory()",
          "torch.empty({b}, dtype=torch.long, pin_memory=True)"]
STAGE = "self.host.copy_(torch.tensor(self.pending)); self.ids.copy_(self.host, non_blocking=True)"


def _scan(tmp_path, prep: str, inside: str):
    b = random.choice([2, 4])
    pinned = random.choice(PINNED).format(b=b)
    path, site = write_target(tmp_path / "pinned_target.py", TARGET.replace("{pinned}", pinned), seed=random.randrange(2**31),
                              d=random.choice([4, 8]), b=b, prep=prep, inside=inside, marker="self.host.copy_")
    return blocking(path), site


def test_pinned_staging_in_prepare_scans_clean_on_a_cpu(tmp_path):
    bad, _ = _scan(tmp_path, STAGE, "pass")
    assert bad.empty, table(bad)


def test_pinned_staging_refilled_in_the_step_is_reported_on_a_cpu(tmp_path):
    """Refilling the pinned buffer from Python data is host work a replay skips (cpu-side-effect), not a
    read of the device (host-sync) nor a copy from pageable memory (pageable-copy)."""
    bad, site = _scan(tmp_path, "pass", STAGE)
    at = set(bad[bad.line == site].category)
    assert "cpu-side-effect" in at and not at & {"host-sync", "pageable-copy"}, table(bad)
