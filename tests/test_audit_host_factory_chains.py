"""A torch factory naming no device, changed by ops on the host, then sent to the device.

A segment-sum mask written `torch.ones(t, t, dtype=torch.bool).tril().to(x.device)` builds the mask in host
memory and copies it to the device from pageable memory on every step, which capture refuses. A CPU scan
sees no copy (`.to()` of a CPU tensor to the CPU is no op), so the source decides; the factory counted only
when its own result was sent, not a result computed from it alone (`.tril()`, `.float()`, `~m`). Now what
ops compute from the factory's result alone counts too; the mask made with `device=x.device` is clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
import torch


def masked(x, t):
    m = torch.ones(t, t{dev}){chain}.to(x.device)  # LIBSITE
    return x[:, :t] @ m.float()
"""

CHAINS = [".tril()", ".triu(1)", ".tril(-1).logical_not()", ".bool().tril()", ".tril().flip(0)"]


@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_host_factory_changed_then_sent(tmp_path, monkeypatch, kind):
    dev = "" if kind == "hit" else ", device=x.device"
    chain = random.choice(CHAINS)
    mod, lib, path, site = library_target(tmp_path, monkeypatch, LIB.format(dev=dev, chain=chain), "hostfac",
                                          "masked", f"masked(self.x @ self.w, {random.randint(2, 4)})",
                                          out="y.sum() * self.x")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "pageable-copy", lib, path, site)
