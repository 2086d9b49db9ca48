"""A torch factory naming no device, changed by ops on the host, then sent to the device.

A segment-sum mask written `torch.ones(t, t, dtype=torch.bool).tril().to(x.device)` builds the mask in host
memory and copies it to the device from pageable memory on every step, which capture refuses. A CPU scan
sees no copy (`.to()` of a CPU tensor to the CPU is no op), so the source decides; the factory counted only
when its own result was sent with `.to()`, not a result computed from it alone (`.tril()`, `.float()`, `~m`),
and not when it was copied into a persistent device buffer (`self.buf.copy_(torch.ones(t, t).tril())`).
Both count now; the mask made with `device=x.device` is clean.
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


class Masker:
    def __init__(self, t, device):
        self.buf = torch.zeros(t, t, device=device)

    def __call__(self, x, t):
        self.buf.copy_(torch.ones(t, t{dev}){chain})  # LIBSITE
        return x[:, :t] @ self.buf
"""

CHAINS = [".tril()", ".triu(1)", ".tril(-1).logical_not()", ".bool().tril()", ".tril().flip(0)"]


@pytest.mark.parametrize("sink", ["to", "copy_"])
@pytest.mark.parametrize("kind", ["clean", "hit"])
def test_host_factory_changed_then_sent(tmp_path, monkeypatch, kind, sink):
    dev = "" if kind == "hit" else (", device=x.device" if sink == "to" else ", device=self.buf.device")
    chain = random.choice(CHAINS) if sink == "to" or random.random() < 0.7 else ""
    t = random.randint(2, 4)
    call = f"masked(self.x @ self.w, {t})" if sink == "to" else f"self.mk(self.x @ self.w, {t})"
    src = LIB.format(dev=dev, chain=chain)
    if sink == "to":  # one marked line per library
        src = src.replace("{chain})  # LIBSITE".format(chain=chain), "{chain})".format(chain=chain))
    else:
        src = src.replace("{chain}.to(x.device)  # LIBSITE".format(chain=chain), "{chain}.to(x.device)".format(chain=chain))
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "hostfac", "masked, Masker", call,
                                          out="y.sum() * self.x", init=f"        self.mk = Masker({t}, self.x.device)")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "pageable-copy", lib, path, site)
