"""A module's Triton kernels are code, not step state: the side-effect snapshot does not walk into their caches.

Walking them cost about a second per audited step for a handful of kernels (a JITFunction keeps its module's
globals and its compile caches), which every scan of a project with its own Triton kernels paid."""

import random
import sys
import textwrap

import pytest

from audit.scan.snapshot import class_state, state
from site_util import blocking, table

triton = pytest.importorskip("triton")
language = pytest.importorskip("triton.language")


def _kernels_module(tmp_path, n: int):
    names = [f"k{random.randrange(10**6)}_{i}" for i in range(n)]
    src = "import triton\nimport triton.language as tl\n" + "".join(textwrap.dedent(f"""
        @triton.jit
        def {name}(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)
        """) for name in names)
    mod_name = f"kernels_{random.randrange(10**9)}"
    (tmp_path / f"{mod_name}.py").write_text(src)
    sys.path.insert(0, str(tmp_path))
    try:
        return __import__(mod_name), names
    finally:
        sys.path.remove(str(tmp_path))


def test_triton_kernels_are_not_snapshotted(tmp_path):
    mod, names = _kernels_module(tmp_path, random.randint(3, 6))
    mod.steps = 0
    snap = class_state.snapshot([], [(mod.__name__, mod)])
    attrs = [k[1] for k in snap if k[0] == f"<module {mod.__name__}>"]
    assert "steps" in attrs  # the module's own plain globals still are state, and so is which kernel a name holds
    inside = [a for a in attrs if a.split(".")[0] in names and "." in a]
    assert not inside, inside[:5]
    assert not [k for k in snap if k[0].startswith("<class JITFunction")]
    assert not state._is_user_object(getattr(mod, names[0]))


def test_a_step_next_to_triton_kernels_still_reports_its_counter(tmp_path):
    mod, names = _kernels_module(tmp_path, 3)
    (tmp_path / "target.py").write_text(textwrap.dedent(f"""
        import torch
        from {mod.__name__} import {names[0]}
        CALLS = 0

        class T:
            def __init__(self, device):
                self.x = torch.randn(8, device=device)
            def prepare(self, i):
                pass
            def step(self):
                global CALLS
                CALLS += 1
                return self.x * 2

        def make(device):
            return T(device)
        """))
    bad = blocking(tmp_path / "target.py", forget=mod.__name__)
    assert sorted(zip(bad.category, bad.line)) == [("cpu-side-effect", 13)], table(bad)
