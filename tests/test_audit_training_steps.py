"""A whole training step as the captured region: forward, backward, an optimizer's step.

- torch.optim's Adam family refuses a capture unless its groups are `capturable=True` (`fused=True` alone
  does not do): a capture-failure at the target's `opt.step()`.
- Without capturable or fused, the optimizer's step counter `state[p]["step"]` lives on the host: advancing
  it is a cpu-side-effect there, and reading it for the bias correction (`.item()`) waits for nothing.
- An optimizer's `param_groups` (and an LR scheduler's attributes) are Python state: writing a new lr into a
  group in the step, through the loop variable `for g in opt.param_groups: g["lr"] = ...`, is a cpu-side-effect
  at that write.
- A hand-written optimizer's state dict keyed by its parameters, filled once, stays the same state while the
  parameters train in place: its keys are the parameters, not their values.
Sizes, learning rates, optimizer classes and names are drawn fresh."""

from __future__ import annotations

import random

import pytest
import torch

from site_util import at, blocking, table, write_target

TPL = """
import torch
from torch import nn
import torch.nn.functional as F
{prelude}

class Target:
    def __init__(self, device):
        torch.manual_seed({seed})
        self.net = nn.Sequential(nn.Linear({d}, {h}), nn.Tanh(), nn.Linear({h}, 1)).to(device)
{init}
        self.{opt} = {make_opt}
{extra_init}
        self.count = 0
        self.x = torch.zeros({b}, {d}, device=device)
        self.y = torch.zeros({b}, 1, device=device)

    def prepare(self, i):
        self.x.copy_(torch.randn({b}, {d}))
        self.y.copy_(torch.randn({b}, 1))
{prepare_line}

    def step(self):
        self.{opt}.zero_grad(set_to_none={none})
        F.mse_loss(self.net(self.x), self.y).backward()
{body}

def make(device):
    return Target(device)
"""


def _scan(tmp_path, make_opt: str, body: str, prelude: str = "", init: str = "", extra_init: str = "",
          prepare_line: str = ""):
    opt = random.choice(["opt", "optimizer", "optim_"])
    fields = dict(seed=random.randrange(2**31), d=random.choice([4, 6, 8]), h=random.choice([5, 7, 12]),
                  b=random.choice([3, 4, 8]), opt=opt, none=random.choice([True, False]),
                  make_opt=make_opt.replace("OPT", opt), body=body.replace("OPT", opt), prelude=prelude, init=init,
                  extra_init=extra_init.replace("OPT", opt), prepare_line=prepare_line)
    path, site = write_target(tmp_path / f"train_{random.randrange(10**6)}.py", TPL, **fields)
    return blocking(path), site


ADAMS = ["Adam", "AdamW", "NAdam", "RAdam", "Adamax", "RMSprop"]


@pytest.mark.parametrize("variant", ["plain", "foreach", "fused"])
def test_optimizer_without_capturable_refuses_capture(tmp_path, variant):
    cls = random.choice(["Adam", "AdamW"] if variant == "fused" else ADAMS)
    extra = {"plain": "", "foreach": ", foreach=True", "fused": ", fused=True"}[variant]
    lr = random.choice([1e-3, 3e-4, 2e-3])
    bad, site = _scan(tmp_path, f"torch.optim.{cls}(self.net.parameters(), lr={lr}{extra})",
                      "        self.OPT.step()  # SITE")
    hit = at(bad, "capture-failure", site)
    assert len(hit) == 1 and hit.iloc[0].op == f"{cls}.step", table(bad)
    assert "capturable" in hit.iloc[0].message


def test_sgd_needs_no_capturable(tmp_path):
    bad, site = _scan(tmp_path, f"torch.optim.SGD(self.net.parameters(), lr={random.choice([0.1, 0.05])}, "
                                f"momentum={random.choice([0.0, 0.9])})", "        self.OPT.step()  # SITE")
    assert bad.empty, table(bad)


@pytest.mark.parametrize("foreach", [False, True])
def test_host_step_counter_is_advanced_not_read(tmp_path, foreach):
    cls = random.choice(["Adam", "AdamW", "NAdam"])
    bad, site = _scan(tmp_path, f"torch.optim.{cls}(self.net.parameters(), lr=1e-3, foreach={foreach})",
                      "        self.OPT.step()  # SITE")
    assert at(bad, "host-sync", site).empty, table(bad)  # the counter is host memory on a GPU: no wait
    hit = at(bad, "cpu-side-effect", site)
    assert len(hit) >= 1 and any("['step']" in m for m in hit.message), table(bad)


@pytest.mark.parametrize("how", ["loop", "enumerate", "clean"])
def test_param_group_lr_written_in_step(tmp_path, how):
    base = random.choice([0.1, 0.03, 0.2])
    lr = f"{base} / (1 + self.count)" if how != "clean" else f"{base}"
    loop = {"loop": f"        for group in self.OPT.param_groups:\n            group['lr'] = {lr}  # SITE",
            "enumerate": f"        for k, pg in enumerate(self.OPT.param_groups):\n            pg['lr'] = {lr}  # SITE",
            "clean": f"        for group in self.OPT.param_groups:\n            group['lr'] = {lr}  # SITE"}[how]
    body = "        self.count += 1\n" * (how != "clean") + loop + "\n        self.OPT.step()"
    bad, site = _scan(tmp_path, "torch.optim.SGD(self.net.parameters(), lr=0.0, momentum=0.9)", body)
    hit = at(bad, "cpu-side-effect", site)
    if how == "clean":
        assert bad.empty, table(bad)
    else:
        assert len(hit) == 1 and "param_groups[0]['lr']" in hit.iloc[0].message, table(bad)


PARAM_KEYED = """
class Momentum:
    def __init__(self, params, lr, beta):
        self.params = list(params)
        self.lr, self.beta = lr, beta
        self.{state} = {{}}

    @torch.no_grad()
    def step(self):
        for p in self.params:
            buf = self.{state}.get(p)
            if buf is None:
                buf = self.{state}[p] = torch.zeros_like(p)
            buf.mul_(self.beta).add_(p.grad)
            p.add_(buf, alpha=-self.lr)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None if set_to_none else p.grad.zero_() if p.grad is not None else None
"""


def test_parameter_keyed_state_trained_in_place(tmp_path):
    prelude = PARAM_KEYED.format(state=random.choice(["state", "bufs", "momenta"]))
    bad, _ = _scan(tmp_path, f"Momentum(self.net.parameters(), {random.choice([0.01, 0.05])}, "
                             f"{random.choice([0.8, 0.9])})", "        self.OPT.step()  # SITE", prelude=prelude)
    assert bad.empty, table(bad)


@pytest.mark.parametrize("flag", ["torch.cuda.is_available()", 'torch.device(device).type == "cuda"',
                                  'device != "cpu"'])
def test_capturable_on_the_gpu_only(tmp_path, flag):
    """`capturable=<device test>`: torch refuses capturable parameters on the CPU, so the CPU scan runs the
    other path (a host step counter, a Python bias correction); a GPU runs the capturable one. What the step of
    that optimizer traced is the CPU's side: info, not a hazard, and no capture failure."""
    if "is_available" in flag and torch.cuda.is_available():
        pytest.skip("the flag is true on a CUDA machine, where the CPU scan's parameters refuse capturable=True")
    cls = random.choice(["Adam", "AdamW", "NAdam"])
    name = random.choice(["on_gpu", "use_graphs", "cap"])
    make_opt = (f"torch.optim.{cls}(self.net.parameters(), lr={random.choice([1e-3, 5e-4])}, "
                f"capturable={name}, foreach={name})")
    bad, site = _scan(tmp_path, make_opt, "        self.OPT.step()  # SITE",
                      init=f"        {name} = {flag}")
    assert bad.empty, table(bad)


SCHEDULERS = ["torch.optim.lr_scheduler.ExponentialLR(self.OPT, gamma={g})",
              "torch.optim.lr_scheduler.StepLR(self.OPT, step_size=1, gamma={g})",
              "torch.optim.lr_scheduler.LambdaLR(self.OPT, lambda k: {g} ** k)"]


@pytest.mark.parametrize("where", ["step", "prepare"])
def test_scheduler_stepped_in_the_step(tmp_path, where):
    """`sched.step()` in the step writes the new lr into the optimizer's `param_groups` and advances the
    scheduler: a cpu-side-effect at that call (not at `opt.step()`, which only reads the lr: its baked value);
    stepped in prepare(), only the baked lr remains."""
    sched = random.choice(SCHEDULERS).format(g=random.choice([0.9, 0.95, 0.97]))
    name = random.choice(["sched", "lr_sched", "scheduler"])
    call = f"        self.{name}.step()  # SITE"
    body = "        self.OPT.step()  # OPTSTEP" + ("\n" + call if where == "step" else "")
    bad, site = _scan(tmp_path, "torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)", body,
                      init="", extra_init=f"        self.{name} = {sched}",
                      prepare_line=f"        self.{name}.step()  # SITE" if where == "prepare" else "")
    effects = bad[bad.category == "cpu-side-effect"]
    if where == "step":
        assert len(effects) >= 1 and set(effects.line) == {site}, table(bad)
    else:
        assert effects.empty, table(bad)
    assert len(bad[bad.category == "baked-host-value"]) >= 1, table(bad)
