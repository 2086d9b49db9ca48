"""torch's process-wide settings changed by the step (`torch.backends.*` flags, the default dtype, the matmul
precision, deterministic algorithms): they live in C++ globals no Python snapshot sees, and a replay never
writes them. A step that leaves one changed is a cpu-side-effect at the writing line (in a library too, with
the target's call as caller); one that sets and restores it, or sets the value it already had, is not.
"""

from __future__ import annotations

import random

import pytest
import torch

from site_util import at, blocking, install_library, library_hit, matmul_target, table, write_target

# name -> (statement with {v}, value prepare() restores, value the step sets)
SETTINGS = {
    "cudnn.benchmark": ("torch.backends.cudnn.benchmark = {v}", "False", "True"),
    "matmul.allow_tf32": ("torch.backends.cuda.matmul.allow_tf32 = {v}", "False", "True"),
    "default_dtype": ("torch.set_default_dtype({v})", "torch.float32", "torch.float64"),
    "matmul_precision": ("torch.set_float32_matmul_precision({v})", "'highest'", "'medium'"),
    "deterministic": ("torch.use_deterministic_algorithms({v})", "False", "True"),
}


@pytest.fixture(autouse=True)
def _restore_settings():
    saved = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.get_default_dtype(),
             torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled())
    yield
    torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32 = saved[0], saved[1]
    torch.set_default_dtype(saved[2])
    torch.set_float32_matmul_precision(saved[3])
    torch.use_deterministic_algorithms(saved[4])


def _own(tmp_path, name: str, form: str):
    stmt, base, alt = SETTINGS[name]
    body = {"leaves": [stmt.format(v=alt) + "  # SITE"],
            "restores": [stmt.format(v=alt) + "  # SITE", "y = torch.tanh(self.x @ self.w)", stmt.format(v=base)],
            "same": [stmt.format(v=base) + "  # SITE"]}[form]
    step = "".join(f"        {line}\n" for line in body) + "        self.out.copy_(torch.tanh(self.x @ self.w))\n" \
        "        return self.out"
    tpl = matmul_target(step=step, prepare="        " + stmt.format(v=base))
    return write_target(tmp_path / f"setting_{form}.py", tpl, seed=random.randrange(2**31), d=random.choice([4, 8, 16]))


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_setting_the_step_leaves_changed_is_a_side_effect(tmp_path, name):
    path, site = _own(tmp_path, name, "leaves")
    bad = blocking(path)
    hit = at(bad, "cpu-side-effect", site)
    assert len(hit) == 1, table(bad)


@pytest.mark.parametrize("form", ["restores", "same"])
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_setting_restored_or_unchanged_is_no_finding(tmp_path, name, form):
    path, _ = _own(tmp_path, name, form)
    bad = blocking(path)
    assert not len(bad), table(bad)


LIB = """
import torch

class Precision:
    def __init__(self):
        self.fast = {start}

    def apply(self):
        self.fast = not self.fast
        torch.backends.cuda.matmul.allow_tf32 = self.fast  # LIBSITE
"""


def test_a_library_flipping_a_flag_per_call_is_found_with_the_callers_line(tmp_path, monkeypatch):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.format(start=random.choice([True, False])), prefix="prec")
    tpl = matmul_target(imports=f"from {mod} import Precision", init="        self.prec = Precision()",
                        step="""        self.prec.apply()  # SITE
        self.out.copy_(torch.tanh(self.x @ self.w))
        return self.out""")
    path, site = write_target(tmp_path / "target" / "lib_prec.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8]))
    library_hit(blocking(path, forget=mod), "cpu-side-effect", lib, path, site)
