"""A custom op whose traced body makes a data-dependent shape is one dynamic-shape finding, at the body's line.

`torch.library.custom_op` bodies (a `torch.nonzero` of the routed rows, a slice to `int(lens.max())`) are traced
as the step's code, so the shape starts varying inside the body and is reported there, with the target's call as
caller. The op's own record at the call site returns that same tensor with inputs of a fixed shape, so it looked
like a second origin: the call line got a dynamic-shape of its own. Baked host values inside a body were already
reported at the body alone; shapes now are too. An op whose body keeps its shapes stays clean.
"""

from __future__ import annotations

import random
import textwrap

import pytest

from site_util import at, blocking, install_library, marked_line, matmul_target, table, write_target

LIB = """
import torch


@torch.library.custom_op("{ns}::pick", mutates_args=())
def pick(x: torch.Tensor) -> torch.Tensor:
    {line}
    return out


@pick.register_fake
def _(x):
    n = torch.library.get_ctx().new_dynamic_size()
    return x.new_empty(n)
"""

BODIES = {
    "nonzero": "out = torch.nonzero(x.flatten() > 0).flatten().float()  # LIBSITE",
    "sliced": "k = int((x > 0).sum()); out = x.flatten()[:k].clone()  # LIBSITE",
    "fixed": "out = torch.where(x > 0, x, 0.0).flatten()  # LIBSITE",
}

# the shift makes the count of positive entries 1, 2, 3, 1, ... whatever the random data (equal counts in every
# audited step would leave no shape to vary)
TARGET = matmul_target(imports="import {mod}  # registers torch.ops.{ns}.pick", step="""\
        h = torch.ops.{ns}.pick(self.x @ self.w + self.shift)  # SITE
        self.out.zero_()
        self.out[0, :h.shape[0]] = h
        return self.out""", init="        self.shift = torch.zeros(1, {d})",
                       prepare="        self.shift.fill_(-100.0)\n        self.shift[0, :i % 3 + 1] = 100.0")


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_shape_made_in_a_custom_op_body_is_reported_once_there(tmp_path, monkeypatch, kind):
    tag = random.randrange(10**9)
    mod, ns = f"shapeops_{tag}", f"rt_shapes_{tag}"
    _, lib = install_library(tmp_path, monkeypatch, textwrap.dedent(LIB).format(ns=ns, line=BODIES[kind]), name=mod)
    path, site = write_target(tmp_path / "target" / "shape_target.py", TARGET, mod=mod, ns=ns,
                              seed=random.randrange(2**31), d=random.choice([8, 16, 32]))
    bad = blocking(path, forget=mod)
    shapes = bad[bad.category == "dynamic-shape"]
    if kind == "fixed":
        assert not len(shapes), table(bad)
        return
    assert not len(at(bad, "dynamic-shape", site)[~at(bad, "dynamic-shape", site).file.str.endswith(lib.name)]), \
        table(bad)
    hit = shapes[shapes.file.str.endswith(lib.name) & (shapes.line == marked_line(lib, "# LIBSITE"))]
    assert len(hit) == 1 and len(shapes) == 1, table(bad)
    assert int(hit.iloc[0].caller_line) == site, table(bad)
