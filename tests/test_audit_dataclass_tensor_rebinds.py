"""cpu-side-effect and state objects rebuilt around a new tensor.

A decode step written functionally hands its state back as a new object: `dataclasses.replace(st, pos=st.pos + 1)`
on a frozen dataclass, stored back by the caller. The attribute then holds another object whose only difference is
the tensor in one field. That is the same change as a container slot rebound to a tensor the step made: when a
later step reads the tensor, step-allocation reports the escape at the line that made it, and no second
cpu-side-effect stands at the store; when no later step reads it, it is no hazard. A rebuilt object whose host
field changed (`n=st.n + 1`) stays a cpu-side-effect."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, table, write_target

TEMPLATE = """
import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class {cls}:
    buf: torch.Tensor
    {field}: torch.Tensor
    n: int = 0


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.w = torch.randn({d}, {d}, generator=g) * 0.1
        self.x = torch.zeros(1, {d})
        self.st = {cls}(torch.zeros(1, {d}), torch.zeros(1, {d}))

    def prepare(self, i):
        self.x.copy_(torch.randn(1, {d}))

    def step(self):
        h = self.x @ self.w {read}
        self.st.buf.copy_(h)
        self.st = dataclasses.replace(self.st, {field}={new}{host})  # SITE
        return h


def make(device):
    return Target()
"""


@pytest.mark.parametrize("kind", ["escaping", "unread", "host"])
def test_a_state_object_rebuilt_around_a_new_tensor(tmp_path, kind):
    cls, field = random.choice(["DecodeState", "StepState", "Carry"]), random.choice(["acc", "last", "pos"])
    path, site = write_target(
        tmp_path / f"rebuilt_{kind}_{random.randrange(10**6)}.py", TEMPLATE, cls=cls, field=field,
        seed=random.randrange(1000), d=random.choice([8, 12, 16]),
        read=f"+ self.st.{field}" if kind == "escaping" else "",
        new="h * 0.5" if kind != "host" else f"self.st.{field}",
        host=", n=self.st.n + 1" if kind == "host" else "")
    bad = blocking(path)
    if kind == "unread":
        assert not len(bad), table(bad)
    elif kind == "escaping":
        assert set(bad.category) == {"step-allocation"}, table(bad)
        assert int(bad.iloc[0].line) == site, table(bad)
    else:
        hit = bad[bad.category == "cpu-side-effect"]
        assert len(hit) == 1 and int(hit.iloc[0].line) == site, table(bad)
