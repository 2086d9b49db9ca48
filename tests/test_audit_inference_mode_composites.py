"""host-sync under torch.inference_mode(): a composite op torch hands the tracer whole is traced as its parts.

Inference code decorates its forward with `@torch.inference_mode()` (the released DeepSeek model routes its
MoE tokens with `idx, top = torch.where(indices == i)`). Outside inference mode torch decomposes
`torch.where(cond)` into `nonzero` before the tracer sees it; inside, the tracer got `aten.where` whole and the
host read in it went unreported, as did `argwhere`, `nonzero(as_tuple=True)`, `torch.linalg.inv`'s error check
and `to_sparse`. Each form must give the same host-sync in both modes, at its line; the three-argument
`torch.where(cond, a, b)`, a composite too, reads nothing. Sizes and data are drawn fresh."""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, table, write_target

TEMPLATE = """
import torch


class Target:
    def __init__(self):
        torch.manual_seed({seed})
        self.x = torch.randn({n})
        self.a = torch.eye({k}) * {scale}
        self.out = torch.zeros({n})

    def prepare(self, i):
        self.x.copy_(torch.randn({n}))

    @torch.{mode}()
    def step(self):
        y = {expr}  # SITE
        self.out.copy_(self.x * {scale})
        return y


def make(device):
    return Target()
"""

FORMS = {
    "where": ("torch.where(self.x > 0)", "aten.nonzero"),
    "argwhere": ("torch.argwhere(self.x > 0)", "aten.nonzero"),
    "nonzero_tuple": ("torch.nonzero(self.x > 0, as_tuple=True)", "aten.nonzero"),
    "inv": ("torch.linalg.inv(self.a)", "aten._linalg_check_errors"),
    "to_sparse": ("self.x.to_sparse()", "aten._to_sparse"),
    "select": ("torch.where(self.x > 0, self.x, 0.0)", None),
}


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_composite_forms(tmp_path, mode, form):
    expr, op = FORMS[form]
    path, site = write_target(tmp_path / f"composite_{form}.py", TEMPLATE, seed=random.randrange(2**31), mode=mode, expr=expr,
                              n=random.choice([6, 8, 12]), k=random.choice([2, 3, 4]), scale=random.choice([2.0, 3.0]))
    bad = blocking(path)
    syncs = at(bad, "host-sync", site)
    if op is None:
        assert not len(bad[bad.category == "host-sync"]), table(bad)
    else:
        assert len(syncs) == 1 and syncs.iloc[0].op == op, table(bad)
