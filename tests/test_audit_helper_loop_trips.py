"""A loop whose trip count comes from a host value and whose body calls a helper of its own class (a draft
model proposing `self.k` tokens: `for _ in range(self.k): logits, tok = self._one(tok)`, `k` set per request)
runs one more call of the helper in one step than in the other: aligned after the last shared call (more
ops run before the loop than after it), the extra ops begin a new call of the function that call ended in. The data-dependent-control finding names the caller's loop (or the
guard in its body that stops it), not the helper's first line, with the target's call as caller. A constant
trip count is clean."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, write_target

LIB = """
import torch
from torch import nn

class Drafter(nn.Module):
    def __init__(self, v, d):
        super().__init__()
        self.emb = nn.Embedding(v, d)
        self.head = nn.Linear(d, v)
        self.k = 2

    def _one(self, tok):
{helper}

    def propose(self, tok):
        tok = (tok.clamp(min=0) * 1 + 0) % self.head.out_features  # more ops before the loop than after it
        toks = []
{loop}
        toks += [tok] * (8 - len(toks))
        return torch.stack(toks, 1)
"""

HELPERS = {"two_lines": ("        logits = self.head(self.emb(tok))\n"
                         "        return logits.argmax(-1)"),
           "one_line": "        return self.head(self.emb(tok)).argmax(-1)"}

LOOPS = {"range": ("        for _ in range(self.k):  # LIBSITE\n"
                   "            tok = self._one(tok)\n"
                   "            toks.append(tok)"),
         "guard": ("        for i in range(8):\n"
                   "            if i >= self.k:  # LIBSITE\n"
                   "                break\n"
                   "            tok = self._one(tok)\n"
                   "            toks.append(tok)"),
         "while": ("        while len(toks) < self.k:  # LIBSITE\n"
                   "            tok = self._one(tok)\n"
                   "            toks.append(tok)"),
         "comprehension": "        toks = [self._one(tok) for _ in range(self.k)]  # LIBSITE"}

TARGET = """
import torch
from {mod} import Drafter

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.dr = Drafter({v}, {d})
        self.ids = torch.zeros(2, dtype=torch.long)
        self.out = torch.zeros(2, 8, dtype=torch.long)

    def prepare(self, i):
        self.ids.copy_(torch.randint(0, {v}, (2,)))
        {k}

    @torch.no_grad()
    def step(self):
        y = self.dr.propose(self.ids)  # SITE
        self.out.copy_(y)
        return self.out

def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("helper", sorted(HELPERS))
@pytest.mark.parametrize("loop", sorted(LOOPS))
@pytest.mark.parametrize("kind", ["varies", "clean"])
def test_a_loop_calling_a_helper_whose_trip_count_is_host_data(tmp_path, monkeypatch, helper, loop, kind):
    src = LIB.replace("{helper}", HELPERS[helper]).replace("{loop}", LOOPS[loop])
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="drafter")
    lo = random.randint(1, 5)
    k = f"self.dr.k = {lo} + i % {random.randint(2, 3)}" if kind == "varies" else f"self.dr.k = {lo}"
    path, site = write_target(tmp_path / "target" / "drafter_t.py", TARGET, mod=mod, seed=random.randrange(2**31),
                              v=random.choice([16, 32]), d=random.choice([4, 8]), k=k)
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "data-dependent-control", lib, path, site)


PROC_LIB = """
import torch

class Scale:
    enabled = True

    def __call__(self, x):
        return x * 0.5 + 1.0

class Shift:
    enabled = True

    def __call__(self, x):
        y = torch.tanh(x)
        return y - 0.25

class Procs(list):
    def __call__(self, x):
        x = (x * 1.0 + 0.0).clamp(-9.0, 9.0)  # more ops before the loop than after it
{loop}
        return x
"""

PROC_LOOPS = {"filtered": ("        active = [p for p in self if p.enabled]\n"
                           "        for proc in active:  # LIBSITE\n"
                           "            x = proc(x)"),
              "filter builtin": ("        for proc in filter(lambda p: p.enabled, self):  # LIBSITE\n"
                                 "            x = proc(x)")}

PROC_TARGET = """
import torch
from {mod} import Procs, Scale, Shift

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.procs = Procs([Scale(), {procs}])
        self.x = torch.zeros(2, {d})
        self.out = torch.zeros(2, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}))
        {flag}

    @torch.no_grad()
    def step(self):
        y = self.procs(self.x)  # SITE
        self.out.copy_(y)
        return self.out

def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("loop", sorted(PROC_LOOPS))
@pytest.mark.parametrize("kind", ["varies", "clean"])
def test_a_processor_loop_over_a_list_filtered_per_request(tmp_path, monkeypatch, loop, kind):
    """The skipped processor's ops begin a call of another function from the loop's body line (the last
    shared op ended in the processor before it): the loop is named, not the skipped processor's first line."""
    mod, lib = install_library(tmp_path, monkeypatch, PROC_LIB.replace("{loop}", PROC_LOOPS[loop]), prefix="procs")
    n = random.randint(1, 3)
    procs = ", ".join(["Shift()", "Scale()"] * n)  # each Shift follows a Scale: the skipped call is of another function
    k = 2 * random.randint(0, n - 1) + 1
    flag = f"self.procs[{k}].enabled = i % 2 == 0" if kind == "varies" else f"self.procs[{k}].enabled = False"
    path, site = write_target(tmp_path / "target" / "procs_t.py", PROC_TARGET, mod=mod, seed=random.randrange(2**31),
                              d=random.choice([4, 8]), procs=procs, flag=flag)
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "data-dependent-control", lib, path, site)
