"""data-dependent-control: a branch inside a helper called with a module call among its arguments, in a loop.

`for layer in self.layers: x = x + layer.cross(layer.ln(x), audio)` where `cross` computes its key/value lazily
(`if self._k is None: self._k = self.k(audio)`), reset per utterance: the op just before the extra ones is the
argument's `ln`, run at the loop's line, and entering `cross` next is the same statement going on, not another
trip of the loop. The lazy branch is named, with the target's call as caller; the loop is not."""

from __future__ import annotations

import random

from site_util import blocking, install_library, marked_line, module_target, table, write_target

LIB = """
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.k = nn.Linear(d, d)
        self.q = nn.Linear(d, d)
        self._k = None

    def {meth}(self, x, audio):
        if self._k is None:  # BRANCH
            self._k = self.k(audio)
        return self.q(x) * self._k


class Stack(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.layers = nn.ModuleList(Layer(d) for _ in range(n))

    def forward(self, x, audio):
        for layer in self.layers:  # LOOP
            x = x + layer.{meth}({arg}, audio)
        return x
"""


def test_lazy_branch_in_a_callee_taking_a_call_argument_is_named(tmp_path, monkeypatch):
    meth = random.choice(["cross", "cross_lazy", "attend"])
    arg = random.choice(["layer.ln(x)", "torch.tanh(layer.ln(x))", "layer.ln(x).relu()"])
    d, n = random.choice([4, 8]), random.choice([2, 3])
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(meth=meth, arg=arg), prefix="argfirst")
    every = random.choice([2, 3])
    tpl = module_target(imports=f"from {mod} import Stack",
                        init=f"        self.st = Stack({d}, {n})\n        self.audio = torch.zeros(1, {d})",
                        prepare=f"        if i % {every} == 0:\n            for l in self.st.layers:\n                l._k = None",
                        step="        y = self.st(self.x, self.audio)  # SITE\n        self.out.copy_(y)")
    path, site = write_target(tmp_path / "target" / "argfirst.py", tpl, seed=random.randrange(2**31), d=d)
    bad = blocking(path, forget=mod)
    ddc = bad[bad.category == "data-dependent-control"]
    assert set(ddc.line) == {marked_line(lib, "# BRANCH")}, table(bad)
    assert (ddc.caller_line == site).all(), table(bad)


PROC_LIB = """
import torch


class ProcessorList(list):
    def __call__(self, ids, scores):
        for proc in self:  # LOOP
            scores = proc(ids, scores)
        return scores


class Scale:
    def __call__(self, ids, scores):
        return torch.softmax(scores, -1) * 2.0


class Batch:
    def __init__(self, n):
        self.procs = [[] for _ in range(n)]

    def apply(self, ids, logits):
        out = []
        for b, procs in enumerate(self.procs):
            plist = ProcessorList(procs)
            out.append(plist({ids}, {rows}))
        return torch.cat(out)
"""


def test_per_request_processor_list_toggled_names_its_loop(tmp_path, monkeypatch):
    """Per-request processor lists applied to rows sliced in the call (`plist(ids[b:b + 1], logits[b:b + 1])`),
    one request's list toggled between steps: the slice just before the extra ops is the argument's, so the
    processor list's own loop, whose trip count changed, is named, not the loop over the rows."""
    rows = random.choice(["logits[b:b + 1]", "logits[b][None]", "logits[b:b + 1] * 1.0"])
    ids = random.choice(["ids[b:b + 1]", "ids"])
    n = random.choice([2, 3, 4])
    mod, lib = install_library(tmp_path, monkeypatch, PROC_LIB.format(rows=rows, ids=ids), prefix="perreq")
    row = random.randrange(n)
    tpl = module_target(imports=f"from {mod} import Batch, Scale",
                        init=f"        self.bt = Batch({n})\n        self.ids = torch.zeros({n}, 3, dtype=torch.long)",
                        prepare=f"        self.bt.procs[{row}] = [Scale()] if i % 2 else []",
                        step=f"        y = self.bt.apply(self.ids, self.x.expand({n}, -1))  # SITE\n"
                             "        self.out.copy_(y[:1])")
    path, site = write_target(tmp_path / "target" / "perreq.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    ddc = bad[bad.category == "data-dependent-control"]
    assert set(ddc.line) == {marked_line(lib, "# LOOP")} and set(ddc.file.map(lambda f: f.split("/")[-1])) == {lib.name}, table(bad)
    assert (ddc.caller_line == site).all(), table(bad)
