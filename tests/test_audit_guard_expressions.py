"""Device-guarded waits written as expressions, read on a CPU scan.

`n = int(lens.max()) if lens.is_cuda else cap` and `x.is_cuda and torch.cuda.synchronize()` pick their
GPU side inside one expression: a CPU scan evaluates the other side, yet on a GPU the wait runs inside the
captured region. The same forms with the wait on the CPU's side are clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import HELPER_LIB, HELPER_TARGET, blocking, install_library, library_hit, table, write_target

# (the helper's body, whether its wait is on the GPU's side)
FORMS = {
    "ifexp-item": ("n = int(z.abs().max()) if z.is_cuda else z.shape[-1]  # LIBSITE\n    return z[:, :n]", True),
    "ifexp-sync": ('torch.cuda.synchronize() if z.device.type == "cuda" else None  # LIBSITE\n    return z', True),
    "and-sync": ("z.is_cuda and torch.cuda.current_stream().synchronize()  # LIBSITE\n    return z", True),
    "assigned-and": ("done = z.is_cuda and torch.cuda.current_stream().query()  # LIBSITE\n    return z", True),
    "spin-wait": ("while z.is_cuda and not torch.cuda.current_stream().query():  # LIBSITE\n        pass\n"
                  "    return z", True),
    "ifexp-cpu-side": ("n = z.shape[-1] if z.is_cuda else 1 + int(z.abs().max())  # LIBSITE\n    return z[:, :n]", False),
    "ifexp-move": ("w = z if z.is_cuda else z.cpu()  # LIBSITE\n    return w", False),
    "and-cpu-side": ("not z.is_cuda and print(z.sum().item())  # LIBSITE\n    return z", False),
}

LIB, TARGET = HELPER_LIB, HELPER_TARGET


def _forms(gpu_side: bool):
    return sorted(k for k, (_, on_gpu) in FORMS.items() if on_gpu == gpu_side)


def _scan(tmp_path, monkeypatch, form: str):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(body=FORMS[form][0]), "expr_lib")
    path, site = write_target(tmp_path / "target" / "expr_target.py", TARGET, mod=mod,
                              d=random.choice([4, 8, 16]), scale=round(random.uniform(0.5, 2.0), 3))
    bad = blocking(path, forget=mod)
    return bad[bad.category == "host-sync"], lib, path, site


@pytest.mark.parametrize("form", _forms(True))
def test_a_wait_on_the_gpus_side_of_an_expression_is_found(tmp_path, monkeypatch, form):
    sync, lib, path, site = _scan(tmp_path, monkeypatch, form)
    library_hit(sync, "host-sync", lib, path, site)


@pytest.mark.parametrize("form", _forms(False))
def test_a_wait_on_the_cpus_side_is_left_to_the_trace(tmp_path, monkeypatch, form):
    """The CPU ran that side: a read there is traced as it ran (a wait that is none on the GPU's side)."""
    sync, lib, _, _ = _scan(tmp_path, monkeypatch, form)
    assert not len(sync[sync.message.str.contains("not traced")]), table(sync)


OWN = """
import torch


class Target:
    def __init__(self, device):
        self.on_gpu = device != "cpu"
        self.x = torch.zeros(2, {d})
        self.out = torch.zeros(2, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(2, {d}))

    def step(self):
        y = torch.tanh(self.x)
        n = int(y.abs().max()) if {test} else {d}  # SITE
        self.out.copy_(y[:, :n])
        return self.out


def make(device):
    return Target(device)
"""


@pytest.mark.parametrize("test", ["y.is_cuda", "self.on_gpu", 'y.device.type != "cpu"'])
def test_the_targets_own_conditional_expression(tmp_path, test):
    """A device flag of the target's own (`self.on_gpu = device != "cpu"`) tells the side by its value here."""
    (tmp_path / "target").mkdir()
    path, site = write_target(tmp_path / "target" / "own_expr.py", OWN, d=random.choice([4, 8, 16]), test=test)
    sync = blocking(path)
    sync = sync[sync.category == "host-sync"]
    assert list(sync.line) == [site] and sync.iloc[0].file.endswith(path.name), table(sync)
