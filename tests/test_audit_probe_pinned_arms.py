"""Offloaded weights pinned only where a GPU is there, and a kept host table's rows pinned inside the step.

Offloading code that also runs on a laptop pins on one arm of a platform probe: `w.to("cpu").pin_memory() if pin
else w.to("cpu")`, a helper `def _pin(t): return t.pin_memory() if torch.cuda.is_available() else t`, or
`[torch.zeros(n, pin_memory=pin) for _ in range(k)]` with `pin = torch.cuda.is_available()` read inside a
comprehension. A CPU scan takes the arm that does not pin; a GPU pins, and uploading those buffers in the step is
legal. Pinning a kept host table's row in the step (`self.blocks[i].pin_memory()`) makes a new pinned copy on a
GPU: the upload raises nothing under capture and every replay uploads the captured step's rows.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, table, write_target

TARGET = """
import torch

L, D = {layers}, {d}
{helper}

class Offloaded:
    def __init__(self, device):
        self.device = device
        g = torch.Generator().manual_seed({seed})
        pin = torch.cuda.is_available()
        ws = [torch.randn(D, D, generator=g).to(device) for _ in range(L)]
        self.host = {host}
        self.x = torch.zeros(1, D, device=device)
        self.out = torch.zeros(1, D, device=device)

    def prepare(self, i):
        self.x.copy_(torch.full((1, D), 0.1 * (i + 1)))

    @torch.no_grad()
    def step(self):
        h = self.x
        for l in range(L):
            w = self.host[l].to(self.device, non_blocking=True)  # SITE
            h = torch.tanh(h @ w)
        self.out.copy_(h)
        return self.out


def make(device):
    return Offloaded(device)
"""

HELPER = """
def _pin(t):
    return t.pin_memory() if torch.cuda.is_available() else t
"""

PINNED = [  # (helper, host expression): pinned on a GPU
    ("", '[w.to("cpu").pin_memory() if pin else w.to("cpu") for w in ws]'),
    ("", '[w.cpu().pin_memory() if torch.cuda.is_available() else w.cpu() for w in ws]'),
    (HELPER, "[_pin(w.detach().cpu()) for w in ws]"),
    ("", "[torch.zeros(D, D, pin_memory=pin).copy_(w.cpu()) for w in ws]"),
]
PAGEABLE = [("", '[w.to("cpu") for w in ws]'), ("", '[w.cpu().pin_memory() if False else w.cpu() for w in ws]')]


def _target(tmp_path, helper: str, host: str):
    return write_target(tmp_path / f"probe_pin_{random.randrange(10**9)}.py", TARGET, helper=helper, host=host,
                        seed=random.randrange(2**31), layers=random.choice([2, 3]), d=random.choice([4, 8]))


def test_weights_pinned_on_a_gpus_arm_of_a_probe_upload_clean(tmp_path):
    for helper, host in PINNED:
        path, _ = _target(tmp_path, helper, host)
        bad = blocking(path)
        assert bad.empty, f"{host}\n{table(bad)}"


def test_weights_left_pageable_are_still_a_pageable_copy(tmp_path):
    helper, host = random.choice(PAGEABLE)
    path, site = _target(tmp_path, helper, host)
    bad = blocking(path)
    hit = bad[(bad.category == "pageable-copy") & (bad.line == site)]
    assert len(hit) and (hit.severity == "blocks-capture").all(), table(bad)


ROWS = """
import torch


class SwapIn:
    def __init__(self, device):
        g = torch.Generator().manual_seed({seed})
        self.blocks = torch.randn({n}, {d}, generator=g)
        self.dev = torch.zeros({d}, device=device)
        self.want = 0

    def prepare(self, i):
        self.want = (i * 3) % {n}

    @torch.no_grad()
    def step(self):
        staged = self.blocks[self.want]{pin}
        self.dev.copy_(staged, non_blocking=True)  # SITE
        return self.dev * 2


def make(device):
    return SwapIn(device)
"""


@pytest.mark.parametrize("pin, severity", [(".pin_memory()", "silent-corruption"), ("", "blocks-capture")])
def test_a_host_row_uploaded_from_a_kept_table(tmp_path, pin, severity):
    """Pinned in the step, the row is a new pinned copy and every replay uploads the captured step's rows (before:
    the stand-in `.pin_memory()` noted the whole kept table as pinned, and the upload was no finding); unpinned, the
    copy from pageable memory blocks capture."""
    path, site = write_target(tmp_path / "pin_rows.py", ROWS, seed=random.randrange(2**31), n=random.choice([4, 5]),
                              d=random.choice([4, 8]), pin=pin)
    bad = blocking(path)
    hit = bad[(bad.category == "pageable-copy") & (bad.line == site)]
    assert len(hit) == 1 and hit.iloc[0].severity == severity, table(bad)
    assert ("pinned in the step" in hit.iloc[0].message) == bool(pin), table(bad)
