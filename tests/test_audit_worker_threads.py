"""A host read in work the step hands to another thread (an output thread detokenizing the sampled ids,
waited on with `.result()` or `join()`): the worker's stack never reaches the step, so the finding had its
own library line as caller. The step's thread, waiting at that moment, is what leads into it: its line
is the caller."""

from __future__ import annotations

import random
import textwrap

from site_util import blocking, install_library, library_hit, marked_line, table, write_target

LIB = """
def {fn}(ids):
    return [f"<{{t}}>" for t in ids.view(-1).tolist()]  # LIBSITE
"""

TARGET = """
import concurrent.futures
import threading

import torch
from {mod} import {fn}


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {d})
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.x = torch.zeros(1, {d})
        self.tok = torch.zeros(1, dtype=torch.long)
        self.text = []

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    @torch.no_grad()
    def step(self):
        self.tok.copy_((self.x @ self.w).argmax(-1))
        {wait}  # SITE
        return self.tok

def make(device):
    return Target()
"""

WAITS = ["self.text = self.pool.submit({fn}, self.tok).result()",
         "t = threading.Thread(target={fn}, args=(self.tok,)); t.start(); t.join()"]


def _planted(tmp_path, monkeypatch, lib_src: str, target: str, slot: str, forms: list, stem: str):
    """(target path, its SITE line, library path, module name): a fresh library module and a target whose `slot`
    is one of `forms`, names drawn fresh."""
    tag = random.randrange(10**9)
    mod, fn = f"{stem}_lib_{tag}", f"{stem}_{tag}"
    _, lib = install_library(tmp_path, monkeypatch, textwrap.dedent(lib_src).format(fn=fn), name=mod)
    path, site = write_target(tmp_path / "target" / f"{stem}_target.py",
                              target.replace(slot, random.choice(forms).format(fn=fn)), mod=mod, fn=fn,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    return path, site, lib, mod


def test_a_read_on_a_worker_thread_has_the_waiting_step_line_as_caller(tmp_path, monkeypatch):
    path, site, lib, mod = _planted(tmp_path, monkeypatch, LIB, TARGET, "{wait}", WAITS, "detok")
    library_hit(blocking(path, forget=mod), "host-sync", lib, path, site)



# vLLM-style overlap submits the host-side grammar work (`fut = pool.submit(fill, ...)`) before the forward and
# waits for it later (`fut.result()`): the caller of a finding inside the worker is the hand-over line, not
# wherever the step's thread is when the worker runs (the forward one step, the wait the next).
HANDOFF_LIB = """
def {fn}(ids, ready):
    ready.wait(5)
    return [f"<{{t}}>" for t in ids.view(-1).tolist()]  # LIBSITE
"""

HANDOFF = TARGET.replace('''        self.tok.copy_((self.x @ self.w).argmax(-1))\n        {wait}  # SITE\n        return self.tok\n''', '''        ready = threading.Event()
        self.tok.copy_((self.x @ self.w).argmax(-1))
        fut = {hand}  # SITE
        y = torch.tanh(self.x @ self.w)
        ready.set()
        text = fut.result()  # WAIT
        return y, text
''')

HANDS = ["self.pool.submit({fn}, self.tok, ready)", "self.pool.submit(lambda: {fn}(self.tok, ready))"]


def test_a_worker_finding_has_the_hand_over_line_as_caller(tmp_path, monkeypatch):
    path, site, lib, mod = _planted(tmp_path, monkeypatch, HANDOFF_LIB, HANDOFF, "{hand}", HANDS, "fill")
    assert marked_line(path, "# WAIT") != site
    library_hit(blocking(path, forget=mod), "host-sync", lib, path, site)


OPS_LIB = """
import torch


def {fn}(ids, stop):
    return torch.nonzero(ids.view(-1) == stop)  # LIBSITE
"""


def test_ops_on_a_worker_thread_are_traced(tmp_path, monkeypatch):
    """A dispatch mode is per thread: a `torch.nonzero` the output thread runs was not traced at all."""
    tag = random.randrange(10**9)
    mod, fn = f"ops_lib_{tag}", f"stops_{tag}"
    _, lib = install_library(tmp_path, monkeypatch, textwrap.dedent(OPS_LIB).format(fn=fn), name=mod)
    wait = random.choice([f"self.text = self.pool.submit({fn}, self.tok, 2).result()",
                          f"t = threading.Thread(target={fn}, args=(self.tok, 2)); t.start(); t.join()"])
    path, site = write_target(tmp_path / "target" / "thread_ops_target.py", TARGET.replace("{wait}", wait), mod=mod,
                              fn=fn, seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    hit = bad[(bad.category == "host-sync") & bad.file.str.endswith(lib.name)
              & (bad.line == marked_line(lib, "# LIBSITE"))]
    assert len(hit) == 1, (wait, table(bad))
    assert int(hit.iloc[0].caller_line) == site, (wait, table(bad))


OVERLAP = """
import concurrent.futures
import threading

import torch

POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1)
GO, HANDED = threading.Event(), threading.Event()


def fill(mask):
    GO.wait()
    row = torch.zeros({v}, dtype=torch.bool)
    row[torch.arange(0, {v}, {stride})] = True
    mask.copy_(row)
    HANDED.set()


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.w = torch.randn({d}, {v})
        self.x = torch.zeros(1, {d})
        self.mask = torch.zeros({v}, dtype=torch.bool)
        self.tok = torch.zeros(1, dtype=torch.long)

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))
        HANDED.clear()
        GO.set() if i % 2 else GO.clear()  # the worker starts at once, or waits for the forward

    @torch.no_grad()
    def step(self):
        fut = POOL.submit(fill, self.mask)  # SITE
        HANDED.wait(0.02)
        logits = self.x @ self.w
        GO.set()
        logits = torch.tanh(logits) * 2
        fut.result()
        self.tok.copy_(logits.masked_fill(~self.mask, float("-inf")).argmax(-1))
        return self.tok


def make(device):
    return Target()
"""


def test_a_worker_whose_ops_interleave_differently_each_step_is_no_data_dependent_control(tmp_path):
    """A grammar bitmask filled by a pool thread while the forward runs: in one step the worker's ops come before
    the forward's, in the next between them. That is scheduling, not a path the data chose."""
    v = random.choice([8, 16])
    path, _ = write_target(tmp_path / "overlap_target.py", OVERLAP, v=v, stride=random.choice([2, 3]),
                           seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    assert not (bad.category == "data-dependent-control").any(), table(bad)
