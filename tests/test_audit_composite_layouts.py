"""A layout op a torch composite picks from its operands' sizes is downstream of the operand's varying shape.

A capacity-factor MoE sizes its dispatch mask `[T, E, C]` from a host count of live requests (C changes between
steps: the dispatch line is the origin, a dynamic-shape and baked-host-values). `torch.einsum` on the next line
permutes the other operand, whose shape never changes, in an order picked from all operands' sizes (a size-1 C is
moved aside), so that permute got other arguments and another output shape: it is not a second origin. A line
that writes its own layout op with a host value stays one.
"""

from __future__ import annotations

import random

from site_util import blocking, table, write_target

TARGET = """
import torch

T, D, E = 8, {d}, 4


class Target:
    def __init__(self):
        g = torch.Generator().manual_seed({seed})
        self.router = torch.randn(D, E, generator=g)
        self.w = torch.randn(E, D, D, generator=g) * 0.1
        self.x = torch.zeros(T, D)
        self.out = torch.zeros(T, D)
        self.cap = 2

    def prepare(self, i):
        self.x.copy_(torch.randn(T, D))
        self.cap = {caps}[i % 2]

    def step(self):
        eid = (self.x @ self.router).argmax(-1)
        mask = torch.nn.functional.one_hot(eid, E)
        pos = ((mask.cumsum(0) - 1) * mask).clamp(min=0)
        disp = torch.nn.functional.one_hot(pos.clamp(max=self.cap - 1), self.cap) * mask[..., None]  # ORIGIN
        xe = {einsum}  # SITE
        self.out.copy_(torch.einsum("tec,ecd->td", disp.float(), torch.bmm(xe, self.w)))
        return self.out


def make(device):
    return Target()
"""


def _scan(tmp_path, einsum):
    path, site = write_target(tmp_path / "cap_target.py", TARGET, seed=random.randrange(2**31),
                              d=random.choice([8, 16, 32]), caps=random.choice(["(1, 2)", "(2, 1)"]), einsum=einsum)
    text = path.read_text().splitlines()
    origin = next(n for n, line in enumerate(text, 1) if "# ORIGIN" in line)
    return blocking(path), site, origin


def test_einsum_permute_of_an_unchanged_operand_is_downstream(tmp_path):
    bad, site, origin = _scan(tmp_path, 'torch.einsum("tec,td->ecd", disp.float(), self.x)')
    assert len(bad[(bad.line == origin) & (bad.category == "dynamic-shape")]) == 1, table(bad)
    assert not len(bad[bad.line == site]), table(bad)


def test_a_layout_the_line_writes_with_a_host_value_stays_an_origin(tmp_path):
    bad, site, origin = _scan(tmp_path, 'torch.einsum("tec,td->ecd", disp.float(), self.x.view(T, self.cap, -1).flatten(1))')
    assert len(bad[(bad.line == site) & (bad.category == "baked-host-value")]) >= 1, table(bad)
