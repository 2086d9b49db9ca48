"""A fork decided by code a capture skips, and the forks that follow from it, are eager-only (info).

transformers builds the attention mask or drops it by reading the mask (`fast_all(padding_mask)`) after
`if is_tracing(padding_mask): return False`; attention then runs another path for a dropped mask. Eager steps with
and without padding fork twice, but a capture always exits early, keeps the mask and records one path that is
right for any data (the decision forks itself: a second check runs only when the first fails). Both forks were blocking data-dependent-control findings; they are info now, naming the
decision. A fork behind a look-alike test that does not ask about capture (`torch.jit.is_tracing()` alone) stays.
"""

from __future__ import annotations

import random

import pytest

from site_util import STREAM_CAPTURING, install_library, marked_line, scanned, table, write_target

LIB = STREAM_CAPTURING + """

def {tracing}(t=None):
    return torch.jit.is_tracing() {capture}


def can_skip(mask):
    if {tracing}(mask):
        return False
    if bool(mask.sum() == mask.numel()):  # DECIDE
        return True
    return bool(mask[:, -1].sum() == mask.shape[0])  # no trailing padding: it may skip too


def attend(x, mask):
    keep = None if can_skip(mask) else (1.0 - mask.float()) * -1e4
    if keep is None:  # FOLLOW
        return torch.softmax(x, -1)
    return torch.softmax(x + keep, -1)
"""

HEAD = """
import torch
import {mod} as lib


class Target:
    def __init__(self):
        self.x = torch.zeros(2, {d})
        self.mask = torch.ones(2, {d})
        self.out = torch.zeros(2, {d})
        self.g = torch.Generator().manual_seed({seed})
"""

TARGET = HEAD + """
    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}, generator=self.g))
        self.mask.fill_(1)
        self.mask[1, {d} - i % 2:] = 0  # padding in every other request

    def step(self):
        self.out.copy_(lib.attend(self.x, self.mask))  # SITE
        return self.out


def make(device):
    return Target()
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_forks_after_a_capture_skipped_decision_are_eager_only(tmp_path, monkeypatch, guarded):
    tracing = random.choice(["is_tracing", "_is_tracing", "tracing_or_capturing"])
    capture = "or _stream_capturing()" if guarded else "or torch.is_grad_enabled() and False"
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(tracing=tracing, capture=capture), prefix="eforks")
    path, site = write_target(tmp_path / "target" / "fork_target.py", TARGET, mod=mod,
                              seed=random.randrange(2**31), d=random.choice([4, 6, 8]))
    inv = scanned(path, forget=mod, steps=4)
    forks = inv.df[inv.df.category == "data-dependent-control"]
    assert len(forks) >= 1 and set(forks.caller_line) == {site}, table(inv.df)
    decide, follow = marked_line(lib, "# DECIDE"), marked_line(lib, "# FOLLOW")
    assert set(forks.line) <= {decide, follow, follow - 1}, table(forks)
    if not guarded:
        assert (forks.severity == "silent-corruption").all(), table(forks)
        return
    assert (forks.severity == "info").all() and not len(inv.blocking()), table(inv.df)
    assert all("eager-only decision" in m for m in forks.message), table(forks)


OWN = HEAD + """        self.served = 0

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}, generator=self.g))
        self.mask.fill_(1)
        self.mask[1, {d} - i % 2:] = 0

    def step(self):
        self.served += 1
        if self.served % 2:  # SITE
            y = lib.attend(self.x, self.mask)
        else:
            y = torch.tanh(lib.attend(self.x, self.mask))
        self.out.copy_(y)
        return self.out


def make(device):
    return Target()
"""


def test_the_targets_own_fork_after_an_eager_only_one_stays(tmp_path, monkeypatch):
    """An A/B switch in the target's step, on a host counter, forks in the same pairs of steps as the mask
    decision inside the library call before it: it is the target's decision, still silent corruption."""
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(tracing="is_tracing", capture="or _stream_capturing()"),
                               prefix="eforks")
    path, site = write_target(tmp_path / "target" / "ab_target.py", OWN, mod=mod,
                              seed=random.randrange(2**31), d=random.choice([4, 6, 8]))
    inv = scanned(path, forget=mod, steps=4)
    hit = inv.blocking()
    hit = hit[(hit.category == "data-dependent-control") & (hit.line == site)]
    assert len(hit) == 1, table(inv.df)
