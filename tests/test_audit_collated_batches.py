"""A batch collated on the host, kept as a (nested) dict attribute and sent to the device in the step.

A target that keeps `{"input_ids": torch.zeros(b, dtype=torch.long), "extra": {"pos": torch.zeros(b)}}` on the
host, refills it in prepare() and moves it with a library's recursive `send_to_device(batch, device)` copies
from pageable memory at every step (capture raises). On a CPU scan the `.to(device)` copies nothing; the
source says the members are made by host factories naming no device. The same dict made with
`device=device`, or pinned, is no finding.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, table, write_target

LIB = """
import torch


def send_to_device(obj, device, non_blocking=False):
    if isinstance(obj, dict):
        return {k: send_to_device(v, device, non_blocking) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(send_to_device(v, device, non_blocking) for v in obj)
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)  # LIBSITE
    return obj
"""

KINDS = {
    "flat": ('{{"ids": torch.zeros({b}, dtype=torch.long), "scale": torch.ones({b})}}', '["scale"]'),
    "nested": ('{{"ids": torch.zeros({b}, dtype=torch.long), "extra": {{"scale": torch.ones({b})}}}}',
               '["extra"]["scale"]'),
    "list": ('{{"ids": torch.zeros({b}, dtype=torch.long), "extra": [torch.ones({b})]}}', '["extra"][0]'),
    "on_device": ('{{"ids": torch.zeros({b}, dtype=torch.long, device=device), '
                  '"extra": {{"scale": torch.ones({b}, device=device)}}}}', '["extra"]["scale"]'),
    "pinned": ('{{"ids": torch.zeros({b}, dtype=torch.long, pin_memory=True), '
               '"extra": {{"scale": torch.ones({b}, pin_memory=True)}}}}', '["extra"]["scale"]'),
}

TARGET = """
import torch
from torch import nn
from {mod} import send_to_device



class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.device = device
        self.emb = nn.Embedding({v}, {d}).to(device)
        self.batch = {batch}
        self.out = torch.zeros({b}, {d}, device=device)

    def prepare(self, i):
        self.batch["ids"].fill_(i % {v})

    @torch.no_grad()
    def step(self):
        batch = send_to_device(self.batch, self.device, non_blocking=True)  # SITE
        self.out.copy_(self.emb(batch["ids"]) * batch{scale}[:, None])
        return self.out


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_host_collated_batch_sent_in_the_step(tmp_path, monkeypatch, kind):
    batch, scale = KINDS[kind]
    b = random.choice([1, 2, 4])
    mod, lib = install_library(tmp_path, monkeypatch, LIB, "collate")
    path, site = write_target(tmp_path / "target" / "collate_target.py", TARGET, mod=mod, scale=scale,
                              batch=batch.format(b=b),
                              seed=random.randrange(2**31), d=random.choice([4, 8]), v=random.choice([16, 32]), b=b)
    bad = blocking(path, forget=mod)
    if kind in ("on_device", "pinned"):
        assert not len(bad), table(bad)
        return
    library_hit(bad, "pageable-copy", lib, path, site)
