"""A wait in a device branch that a plain flag keeps closed, read on a CPU scan.

`if self.timing and x.is_cuda: torch.cuda.synchronize()` never runs on a CPU, so the scan reads the
wait from the source. It runs on a GPU only while `self.timing` holds: a flag that was false in every
audited step keeps the wait out of reach there too, so it is no finding, and the same flag true makes it
one. A flag computed by a call (a platform probe that answers differently without a GPU) is not trusted.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, marked_line, matmul_target, table, write_target

FORMS = {
    "and": """
    def run(self, x, out):
        y = torch.tanh(x @ self.w)
        if self.timing and y.is_cuda:
            torch.cuda.synchronize()  # LIBSITE
        out.copy_(y)
    """,
    "nested": """
    def run(self, x, out):
        y = torch.tanh(x @ self.w)
        if self.timing:
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # LIBSITE
        out.copy_(y)
    """,
    "compare": """
    def run(self, x, out):
        y = torch.tanh(x @ self.w)
        if self.mode == "profile" and y.device.type == "cuda":
            torch.cuda.current_stream().synchronize()  # LIBSITE
        out.copy_(y)
    """,
    "parameter": """
    def run(self, x, out, sync=False):
        y = torch.tanh(x @ self.w)
        if sync:
            if y.is_cuda:
                n = int(y.abs().max())  # LIBSITE
        out.copy_(y)
    """,
    "early-return": """
    def run(self, x, out):
        y = torch.tanh(x @ self.w)
        out.copy_(y)
        if not y.is_cuda or not self.timing:
            return
        torch.cuda.synchronize()  # LIBSITE
    """,
    "nested-expression": """
    def run(self, x, out):
        y = torch.tanh(x @ self.w)
        if self.timing:
            n = int(y.abs().max()) if y.is_cuda else 1  # LIBSITE
        out.copy_(y)
    """,
    "expression-and": """
    def run(self, x, out):
        y = torch.tanh(x @ self.w)
        self.timing and y.is_cuda and torch.cuda.synchronize()  # LIBSITE
        out.copy_(y)
    """,
    "nested-and": """
    def run(self, x, out):
        y = torch.tanh(x @ self.w)
        if self.timing:
            y.is_cuda and torch.cuda.synchronize()  # LIBSITE
        out.copy_(y)
    """,
    "config": """
    def run(self, x, out):
        y = torch.tanh(x @ self.w)
        if self.cfg.debug:
            if y.is_cuda:
                print(y.sum().item())  # LIBSITE
        out.copy_(y)
    """,
}

LIB = """
import torch


class Cfg:
    def __init__(self, debug):
        self.debug = debug


class Runner:
    def __init__(self, w, timing):
        self.w = w
        self.timing = timing
        self.mode = "profile" if timing else "serve"
        self.cfg = Cfg(debug=timing)
{form}
"""

TARGET = """
import torch
from {mod} import Runner


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.runner = Runner(torch.randn({d}, {d}, generator=g) * 0.1, timing={flag})
        self.x = torch.zeros(1, {d})
        self.out = torch.zeros(1, {d})

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        self.runner.run(self.x, self.out{extra})  # SITE
        return self.out


def make(device):
    return Target()
"""


def _scan(tmp_path, monkeypatch, form: str, flag: bool, lib_source: str = LIB):
    body = FORMS[form]
    mod, lib = install_library(tmp_path, monkeypatch, lib_source.format(form=body), "flag_lib")
    extra = f", sync={flag}" if form == "parameter" else ""
    path, site = write_target(tmp_path / "target" / "flag_target.py", TARGET, mod=mod, flag=flag, extra=extra,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    return bad[bad.category == "host-sync"], lib, path, site


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_wait_behind_a_false_flag_is_no_finding(tmp_path, monkeypatch, form):
    sync, lib, _, _ = _scan(tmp_path, monkeypatch, form, False)
    assert not len(sync), table(sync)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_same_wait_behind_a_true_flag_is_found_with_the_targets_call(tmp_path, monkeypatch, form):
    sync, lib, path, site = _scan(tmp_path, monkeypatch, form, True)
    library_hit(sync, "host-sync", lib, path, site)


PROBED = LIB.replace("        self.timing = timing\n", "        self.timing = _gpu_tools()\n").replace(
    "import torch\n", "import shutil\nimport torch\n\n\ndef _gpu_tools():\n"
    "    return shutil.which('nvidia-smi-not-here') is not None\n", 1)


def test_a_flag_set_by_a_probe_is_not_trusted(tmp_path, monkeypatch):
    """`self.timing = _gpu_tools()` may answer false only because this machine has no GPU."""
    sync, lib, path, site = _scan(tmp_path, monkeypatch, "nested", False, PROBED)
    library_hit(sync, "host-sync", lib, path, site)


OWN = matmul_target(imports='import os\n\nDEBUG = os.environ.get("{env}", "0") == "1"', step="""\
        y = torch.tanh(self.x @ self.w)
        if DEBUG and y.is_cuda:
            torch.cuda.synchronize()  # SITE
        self.out.copy_(y)
        return self.out""")


@pytest.mark.parametrize("flag", [False, True])
def test_a_module_flag_from_the_environment_in_the_targets_own_code(tmp_path, monkeypatch, flag):
    """`DEBUG = os.environ.get(...) == "1"` reads configuration, the same on the GPU machine: trusted."""
    (tmp_path / "target").mkdir()
    env = f"OWN_FLAG_{random.randrange(10**6)}"
    monkeypatch.setenv(env, "1" if flag else "0")
    path, site = write_target(tmp_path / "target" / "own_flag.py", OWN, env=env,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    sync = blocking(path)
    sync = sync[sync.category == "host-sync"]
    if flag:
        assert list(sync.line) == [site] and sync.iloc[0].file.endswith(path.name), table(sync)
    else:
        assert not len(sync), table(sync)
    assert marked_line(path, "# SITE") == site

