"""Settings that are one value under two names, and settings written per step with a changing value.

`torch.set_float32_matmul_precision("high")` turns `torch.backends.cuda.matmul.allow_tf32` on. A scoped helper
that sets the precision, then the flag, and restores both in its `finally` writes the flag first when it already
reads True and last back to False: judged by its first write, the step "leaves it changed". Judged by the value
the step found and the value it left, it changes nothing. A setting left changed is still reported.

A setting set and restored in the step with a value the host picks per step (`with torch.autocast(...,
dtype=self.dtype)`, a request's own dtype) is no lasting change, but a capture records the kernels of the
captured value and every replay runs them: a baked-host-value at the line that sets it.
"""

from __future__ import annotations

import random

import pytest
import torch

from site_util import at, blocking, matmul_target, table, write_target

SCOPED = '''
import contextlib

@contextlib.contextmanager
def fast_matmul():
    prev_prec = torch.get_float32_matmul_precision()
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.set_float32_matmul_precision("{prec}")
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
        torch.set_float32_matmul_precision(prev_prec)
'''


@pytest.fixture(autouse=True)
def _settings_back():
    prec, tf32 = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.set_float32_matmul_precision(prec)


def test_a_linked_setting_restored_by_a_scoped_helper_is_no_finding(tmp_path):
    tpl = matmul_target("        with fast_matmul():\n            h = torch.tanh(self.x @ self.w)\n"
                        "        self.out.copy_(h)\n        return self.out",
                        imports=SCOPED.format(prec=random.choice(["high", "medium"])))
    path, _ = write_target(tmp_path / "scoped_prec.py", tpl, marker="def step", seed=random.randrange(2**31),
                           d=random.choice([4, 8, 16]))
    bad = blocking(path)
    assert not len(bad), table(bad)


def test_a_linked_setting_left_changed_is_still_reported(tmp_path):
    tpl = matmul_target("        torch.set_float32_matmul_precision(self.prec[self.i % 2])  # SITE\n"
                        "        h = torch.tanh(self.x @ self.w)\n        self.out.copy_(h)\n        return self.out",
                        init='        self.prec, self.i = ["highest", "high"], 0',
                        prepare="        self.i = i")
    path, site = write_target(tmp_path / "left_prec.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    assert len(at(bad, "cpu-side-effect", site)) == 1, table(bad)


@pytest.mark.parametrize("fixed", [False, True])
def test_an_autocast_dtype_picked_per_step_is_a_baked_value_at_the_with(tmp_path, fixed):
    pick = "torch.bfloat16" if fixed else "self.dtypes[self.i % 2]"
    tpl = matmul_target(f'        with torch.autocast("cpu", dtype={pick}):  # SITE\n'
                        "            h = torch.tanh(self.x @ self.w)\n        self.out.copy_(h)\n        return self.out",
                        init="        self.dtypes, self.i = [torch.bfloat16, torch.float16], 0",
                        prepare="        self.i = i")
    path, site = write_target(tmp_path / "amp_pick.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    hits = at(bad, "baked-host-value", site)
    assert len(hits) == (0 if fixed else 1), table(bad)
    assert fixed or "autocast dtype" in hits.message.iloc[0], table(bad)
