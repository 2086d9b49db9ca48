"""A custom op taking a Python value that changes every step (`torch.ops.lib.scale_at(h, self.pos)`).

The dispatch mode records the op with its non-tensor arguments, and the tracer runs its Python body, whose
ops take the value too. When the body bakes it (a scalar operand, a fill value), that is the one finding:
at the body's line, with the target's call as caller, as for every hazard inside a custom op, not a second
one at the call. When no op of the body takes it (a kernel outside the tracer would), the call is reported.
"""

from __future__ import annotations

import random
import textwrap

import pytest

from site_util import at, blocking, install_library, library_hit, matmul_target, table, write_target

LIB = """
import torch


@torch.library.custom_op("{ns}::scale_at", mutates_args=())
def scale_at(x: torch.Tensor, pos: int) -> torch.Tensor:
    {line}


@scale_at.register_fake
def _(x, pos):
    return torch.empty_like(x)
"""

BODIES = {
    "scalar": "return x * (1.0 + {k} * pos)  # LIBSITE",
    "fill": "return torch.full_like(x, float(pos)) * x  # LIBSITE",
}

TARGET = matmul_target(imports="import {mod}  # registers torch.ops.{ns}.scale_at", init="        self.pos = 0",
                       prepare="        self.pos = i + {off}", step="""\
        h = torch.ops.{ns}.scale_at(self.x @ self.w, self.pos)  # SITE
        self.out.copy_(h)
        return self.out""")


def _scan(tmp_path, monkeypatch, line: str):
    tag = random.randrange(10**9)
    mod, ns = f"argop_{tag}", f"rt_args_{tag}"
    line = line.format(k=round(random.uniform(0.001, 0.1), 4))
    _, lib = install_library(tmp_path, monkeypatch, textwrap.dedent(LIB).format(ns=ns, line=line), name=mod)
    path, site = write_target(tmp_path / "target" / "argop_target.py", TARGET, mod=mod, ns=ns,
                              off=random.randrange(1, 50), seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    return blocking(path, forget=mod), lib, path, site


@pytest.mark.parametrize("body", sorted(BODIES))
def test_a_value_the_body_bakes_is_one_finding_in_the_body(tmp_path, monkeypatch, body):
    bad, lib, path, site = _scan(tmp_path, monkeypatch, BODIES[body])
    library_hit(bad, "baked-host-value", lib, path, site)
    assert len(bad[bad.category == "baked-host-value"]) == 1, table(bad)


def test_a_value_no_traced_op_takes_is_reported_at_the_call(tmp_path, monkeypatch):
    # the body runs no op on the value (a kernel outside the tracer would take it): the call bakes it
    bad, lib, path, site = _scan(tmp_path, monkeypatch, "return x.clone() if pos >= 0 else x.clone()  # LIBSITE")
    hit = at(bad, "baked-host-value", site)
    assert len(hit) == 1 and hit.iloc[0].file.endswith(path.name), table(bad)
