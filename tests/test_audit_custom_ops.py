"""The Python body of a custom op is traced like any other code of the step.

The dispatch mode sees a custom op as one op; torch runs its body below the mode. Both registrations
with a Python body count: `torch.library.custom_op` and `torch.library.Library(...).impl(name, fn, key)`. A hazard inside the
body (a `torch.nonzero` that syncs, a counter in the library's globals) is found at the body's line,
with the target's call of the op as caller. A body of device ops only stays clean.
"""

from __future__ import annotations

import random
import textwrap

import pytest

from site_util import blocking, install_library, marked_line, matmul_target, table, write_target

LIB = """
import torch

CALLS = {{"n": 0}}


@torch.library.custom_op("{ns}::body", mutates_args=())
def body(x: torch.Tensor) -> torch.Tensor:
    {line}
    return out


@body.register_fake
def _(x):
    return torch.empty_like(x)
"""

LIB_IMPL = """
import torch

CALLS = {{"n": 0}}
_lib = torch.library.Library("{ns}", "DEF")
_lib.define("body(Tensor x) -> Tensor")


def body(x):
    {line}
    return out


_lib.impl("body", body, "{key}")
"""

REGISTRATIONS = {"custom_op": LIB, "impl_composite": LIB_IMPL, "impl_cpu": LIB_IMPL}

BODIES = {
    "nonzero": ("host-sync", "rows = torch.nonzero(x > 0); out = x * rows.numel()  # LIBSITE"),
    "counter": ("cpu-side-effect", "CALLS['n'] += 1; out = torch.sigmoid(x)  # LIBSITE"),
    "clean": (None, "out = torch.where(x > 0, x, x * 0.5)  # LIBSITE"),
}

TARGET = matmul_target(imports="import {mod}  # registers torch.ops.{ns}.body", step="""\
        h = torch.ops.{ns}.body(self.x @ self.w)  # SITE
        self.out.copy_(h)
        return self.out""")


@pytest.mark.parametrize("reg", sorted(REGISTRATIONS))
@pytest.mark.parametrize("kind", sorted(BODIES))
def test_a_custom_ops_python_body_is_traced(tmp_path, monkeypatch, kind, reg):
    category, line = BODIES[kind]
    tag = random.randrange(10**9)
    mod, ns = f"oplib_{tag}", f"rt_ops_{tag}"
    key = "CPU" if reg == "impl_cpu" else "CompositeExplicitAutograd"
    _, lib = install_library(tmp_path, monkeypatch, textwrap.dedent(REGISTRATIONS[reg]).format(ns=ns, line=line, key=key),
                             name=mod)
    path, site = write_target(tmp_path / "target" / "op_target.py", TARGET, mod=mod, ns=ns,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    if category is None:
        assert not len(bad), table(bad)
        return
    hit = bad[(bad.category == category) & bad.file.str.endswith(lib.name) & (bad.line == marked_line(lib, "# LIBSITE"))]
    assert len(hit) == 1, table(bad)
    assert hit.iloc[0].caller_file.endswith(path.name) and int(hit.iloc[0].caller_line) == site, \
        hit[["caller_file", "caller_line"]].to_string()
