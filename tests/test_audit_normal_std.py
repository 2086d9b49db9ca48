"""torch.normal with a tensor std checks `std.min() >= 0` with `.item()` inside the op on every device, so
`Normal(loc, scale).sample()` waits for the device; a CPU scan sees one op and must still name the line.
A float std, `rsample()` and `loc + scale * randn_like(loc)` check nothing on the device."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TARGET = """
import torch
from torch.distributions import Normal

class Policy:
    def __init__(self, device):
        self.w = torch.randn({d}, {d}, device=device) * 0.1
        self.x = torch.randn(1, {d}, device=device)
        self.log_std = torch.full((1, {d}), {ls}, device=device)
        self.out = torch.zeros(1, {d}, device=device)

    def prepare(self, i):
        self.x.normal_()

    def step(self):
        mu = torch.tanh(self.x @ self.w)
        std = self.log_std.exp()
        a = {draw}  # SITE
        self.out.copy_(a)
        return self.out

def make(device):
    return Policy(device)
"""

CHECKED = {"normal-tensor-std": "torch.normal(mu, std)",
           "normal-float-mean": "torch.normal(0.0, std).add(mu)",
           "distribution-sample": "Normal(mu, std, validate_args=False).sample()"}
UNCHECKED = {"float-std": "torch.normal(mu, 0.5)",
             "rsample": "Normal(mu, std, validate_args=False).rsample()",
             "reparameterized": "mu + std * torch.randn_like(mu)"}


def _write(tmp_path, draw: str):
    return write_target(tmp_path / "policy_target.py", TARGET, d=random.choice([4, 8, 16]),
                        ls=round(random.uniform(-2, 0), 3), draw=draw)


@pytest.mark.parametrize("form", sorted(CHECKED))
def test_a_tensor_std_is_checked_on_the_host(tmp_path, form):
    path, site = _write(tmp_path, CHECKED[form])
    bad = blocking(path)
    hit = at(bad, "host-sync", site)
    assert len(hit) == 1, table(bad)
    assert "std" in hit.iloc[0].message


@pytest.mark.parametrize("form", sorted(UNCHECKED))
def test_no_device_check_is_no_sync(tmp_path, form):
    path, site = _write(tmp_path, UNCHECKED[form])
    bad = blocking(path)
    assert at(bad, "host-sync", site).empty, table(bad)
