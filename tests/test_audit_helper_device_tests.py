"""host-sync: a wait behind a helper of the target's file that returns a device test is read from the source.

`def on_gpu(d): return torch.device(d).type == "cuda"`, then `if on_gpu(self.device): torch.cuda.synchronize()`
in the step (an RL loop timing its policy): a CPU scan takes the other side and traces no wait, yet a GPU runs
it inside the captured region. A helper (module function or method) whose every `return` is a device test makes
its call a device test, as a name with `cuda` in it already did; one returning anything else (a logging flag
read from the environment) does not, and its untaken side is left alone. Names and spellings are drawn fresh."""

from __future__ import annotations

import random
import textwrap

from site_util import blocking, marked_line, table

TARGET = """
import os

import torch

{helper}

class Target:
    def __init__(self, device):
        self.device = device
        self.w = torch.randn(8, 8, generator=torch.Generator().manual_seed({seed})).to(device)
        self.x = torch.zeros(8, device=device)
        self.out = torch.zeros(8, device=device)
{method}
    def prepare(self, i):
        self.x.copy_(torch.randn(8, generator=torch.Generator().manual_seed(i)))

    @torch.no_grad()
    def step(self):
        self.out.copy_(self.x @ self.w)
        if {call}:
            {wait}  # SITE
        return self.out


def make(device):
    return Target(device)
"""

DEVICE_RETURNS = ['torch.device({p}).type == "cuda"', 'str({p}).startswith("cuda") and torch.cuda.is_available()',
                  'torch.device({p}).type != "cpu"']
OTHER_RETURNS = ['os.environ.get("RL_DEBUG_{n}", "0") == "1"', '{p} in ("debug", "trace")']
WAITS = ["torch.cuda.synchronize()", "torch.cuda.current_stream().synchronize()"]


def _write(tmp_path, device_helper: bool):
    name = random.choice(["on_gpu", "accelerated", "uses_accel", "is_fast_device"])
    p = random.choice(["device", "d", "where"] if device_helper else ["mode", "level"])  # `device in (...)` is a device test
    ret = random.choice(DEVICE_RETURNS if device_helper else OTHER_RETURNS).format(p=p, n=random.randrange(100))
    as_method = random.random() < 0.5
    fn = f"def {name}({'self, ' if as_method else ''}{p}):\n    return {ret}\n"
    helper, method = ("", textwrap.indent("\n" + fn, "    ")) if as_method else (fn, "")
    call = f"{'self.' if as_method else ''}{name}(self.device)"
    seed = random.randrange(2**20)
    path = tmp_path / f"helper_{seed}.py"
    path.write_text(TARGET.format(helper=helper, method=method, call=call, wait=random.choice(WAITS), seed=seed))
    return path, marked_line(path, "# SITE")


def test_a_wait_behind_a_device_test_helper_is_reported(tmp_path):
    path, line = _write(tmp_path, device_helper=True)
    bad = blocking(path)
    assert len(bad[(bad.category == "host-sync") & (bad.line == line)]) == 1, table(bad)


def test_a_helper_returning_no_device_test_is_not_one(tmp_path):
    path, _ = _write(tmp_path, device_helper=False)
    bad = blocking(path)
    assert not len(bad), table(bad)
