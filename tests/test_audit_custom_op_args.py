"""A custom op taking a Python value that changes every step (`torch.ops.lib.scale_at(h, self.pos)`).

The dispatch mode records the op with its non-tensor arguments, and the tracer runs its Python body, whose
ops take the value too. The value enters the graph at the call: that is the one baked-host-value finding,
not one more at each op of the body that takes it. A body that bakes a value of its own (a counter in the
library's globals) while the call's arguments stay the same is reported in the body, with the target's
call as caller.
"""

from __future__ import annotations

import random
import textwrap

import pytest

from site_util import at, blocking, install_library, library_hit, matmul_target, table, write_target

LIB = """
import torch

STATE = {{"n": 0}}


@torch.library.custom_op("{ns}::scale_at", mutates_args=())
def scale_at(x: torch.Tensor, pos: int) -> torch.Tensor:
    {line}


@scale_at.register_fake
def _(x, pos):
    return torch.empty_like(x)
"""

BODIES = {
    "scalar": "return x * (1.0 + {k} * pos)",
    "fill": "return torch.full_like(x, float(pos)) * x",
    "two-ops": "y = x * (1.0 + {k} * pos); return y + {k} * pos",
    "no-op-takes-it": "return x.clone() if pos >= 0 else x.clone()",
}

TARGET = matmul_target(imports="import {mod}  # registers torch.ops.{ns}.scale_at", init="        self.pos = 0",
                       prepare="        self.pos = {pos}", step="""\
        h = torch.ops.{ns}.scale_at(self.x @ self.w, self.pos)  # SITE
        self.out.copy_(h)
        return self.out""")


def _scan(tmp_path, monkeypatch, line: str, pos: str):
    tag = random.randrange(10**9)
    mod, ns = f"argop_{tag}", f"rt_args_{tag}"
    line = line.format(k=round(random.uniform(0.001, 0.1), 4))
    _, lib = install_library(tmp_path, monkeypatch, textwrap.dedent(LIB).format(ns=ns, line=line), name=mod)
    path, site = write_target(tmp_path / "target" / "argop_target.py", TARGET, mod=mod, ns=ns, pos=pos,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    return blocking(path, forget=mod), lib, path, site


@pytest.mark.parametrize("body", sorted(BODIES))
def test_a_changing_argument_is_one_finding_at_the_call(tmp_path, monkeypatch, body):
    bad, lib, path, site = _scan(tmp_path, monkeypatch, BODIES[body], pos=f"i + {random.randrange(1, 50)}")
    baked = bad[bad.category == "baked-host-value"]
    assert len(baked) == 1 and len(at(baked, "baked-host-value", site)) == 1, table(bad)
    assert baked.iloc[0].file.endswith(path.name), table(bad)


def test_a_value_the_body_bakes_on_its_own_is_found_in_the_body(tmp_path, monkeypatch):
    line = 'STATE["n"] += 1; return x * (1.0 + {k} * STATE["n"])  # LIBSITE'
    bad, lib, path, site = _scan(tmp_path, monkeypatch, line, pos=str(random.randrange(1, 50)))
    library_hit(bad, "baked-host-value", lib, path, site)
    assert not len(at(bad, "baked-host-value", site)), table(bad)
