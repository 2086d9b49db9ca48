"""`torch.compile(fullgraph=True)` functions and eager `flex_attention` in the step, on a CPU scan.

Dynamo skips every frame while a dispatch mode is active, and with fullgraph=True a skipped frame raises
("found no compiled frames"): the scan stopped at any fullgraph function compiled in warmup, and at
`flex_attention`, which torch itself runs through `torch.compile(fullgraph=True)`. During an audited step
compiled code runs as its Python source, so a static function is no finding and one that takes a changing
Python int is a baked-host-value at its line, with the target's call as caller.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, library_hit, library_target, matmul_target, table, write_target

LIB = """
import torch

@torch.compile(fullgraph=True, backend="eager")
def fused(x, k: int):
    return torch.tanh(x) + 0.25 * k  # LIBSITE
"""


def _lib_target(tmp_path, monkeypatch, k: str):
    return library_target(tmp_path, monkeypatch, LIB, "compiled", "fused", f"fused(self.x @ self.w, {k})",
                          init="        self.pos = 0", prepare="        self.pos = i")


def test_a_fullgraph_function_with_a_changing_int_is_a_baked_value(tmp_path, monkeypatch):
    mod, lib, path, site = _lib_target(tmp_path, monkeypatch, "self.pos")
    library_hit(blocking(path, forget=mod), "baked-host-value", lib, path, site)


def test_a_static_fullgraph_function_is_no_finding(tmp_path, monkeypatch):
    mod, lib, path, site = _lib_target(tmp_path, monkeypatch, str(random.randrange(1, 9)))
    bad = blocking(path, forget=mod)
    assert not len(bad), table(bad)


OWN = matmul_target(imports="from torch.nn.attention.flex_attention import flex_attention", step="""        q = torch.tanh(self.x @ self.w).view(1, 1, 1, -1)
        y = flex_attention(q, q, q)  # SITE
        self.out.copy_(y.view(1, -1))
        return self.out""")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_eager_flex_attention_in_the_step_scans_and_is_no_finding(tmp_path):
    path, _ = write_target(tmp_path / "own_flex.py", OWN, seed=random.randrange(2**31), d=random.choice([8, 16]))
    bad = blocking(path)
    assert not len(bad), table(bad)
