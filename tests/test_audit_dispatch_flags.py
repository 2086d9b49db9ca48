"""Flags a dispatch implementation tests before a device-guarded wait: unpacked locals and identity tests.

A quantized weight's `mm` implementation unpacks its arguments (`x, w = args`) and waits for the device only
for a debugging class (`if x.is_cuda and w.sync_debug: torch.cuda.current_stream().synchronize()`); a
TorchFunctionMode waits after one function only (`if func is F.linear and args[0].is_cuda:`). In library code
a wait behind a flag counts only when the scan read the flag true. The scan never read either flag: `w` is
bound in the function (a local bound before the test was taken for one rebound later), and an identity test of
two names (`func is F.linear`) was no flag read, so both waits were dropped. A local the function binds only
before the test, outside any loop, holds the value the test read once the function has gone past it; `is`
runs no code. The wait is reported when the flag held, and not when it did not.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, module_target, write_target

DISPATCH = """
import torch

aten = torch.ops.aten


class QWeight(torch.Tensor):
    {flag} = {value}

    @staticmethod
    def __new__(cls, w):
        return torch.Tensor._make_wrapper_subclass(cls, w.shape, dtype=w.dtype, device=w.device)

    def __init__(self, w):
        self.w = w

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.mm.default:
            return _mm(*args)
        args = [a.w if isinstance(a, QWeight) else a for a in args]
        return func(*args, **(kwargs or {{}}))


def _mm(*args):
    x, w = args
    y = x @ w.w
    if x.is_cuda and w.{flag}:
        torch.cuda.current_stream().synchronize()  # LIBSITE
    return y * 1.0
"""

MODE = """
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class SyncMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {{}}))
        if func is {fn} and args[0].is_cuda:
            torch.cuda.synchronize()  # LIBSITE
        return out
"""


@pytest.mark.parametrize("kind", ["hit", "clean"])
def test_flag_of_an_unpacked_local(tmp_path, monkeypatch, kind):
    flag = random.choice(["sync_debug", "timing", "check"])
    mod, lib = install_library(tmp_path, monkeypatch, DISPATCH.format(flag=flag, value=kind == "hit"), prefix="dq")
    tpl = module_target(imports=f"from {mod} import QWeight", init="        self.w = QWeight(torch.randn({d}, {d}))",
                        step="        self.out.copy_(torch.mm(self.x, self.w))  # SITE\n        return self.out")
    path, site = write_target(tmp_path / "target" / "dq.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]))
    clean_or_hit(blocking(path, forget=mod), kind, "host-sync", lib, path, site)


@pytest.mark.parametrize("kind", ["hit", "clean"])
def test_identity_test_in_a_function_mode(tmp_path, monkeypatch, kind):
    fn = "F.linear" if kind == "hit" else random.choice(["F.embedding", "F.conv1d"])
    mod, lib = install_library(tmp_path, monkeypatch, MODE.format(fn=fn), prefix="fm")
    tpl = module_target(imports=f"from {mod} import SyncMode", init="        self.lin = nn.Linear({d}, {d})",
                        step="        with SyncMode():\n            y = self.lin(self.x)  # SITE\n"
                             "        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "fm.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]))
    clean_or_hit(blocking(path, forget=mod), kind, "host-sync", lib, path, site)
