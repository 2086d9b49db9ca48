"""The caller of a cpu-side-effect found in the source when no torch op ran where the state changed.

- A library hook object hung on one of the target's modules (`register_forward_hook(Counter())`) is
  called by torch from the module's call: its statement is the site, the target's line that called the
  module is the caller (not the library line again).
- A target split over its own package: a helper in one own module changes that module's globals and is
  called from another own module. The statement is own code, so it is its own caller (not the line that
  called the helper, which is the rule for library functions).
"""

from __future__ import annotations

import random
import sys
import textwrap

from site_util import blocking, install_library, marked_line, module_target, table, write_target

HOOK_LIB = """
class Counter:
    def __init__(self):
        self.calls = 0

    def __call__(self, module, args, output):
        self.calls += 1  # LIBSITE
"""

HOOK_TARGET = module_target(imports="from {mod} import Counter", init="""\
        self.proj = nn.Linear({d}, {d})
        self.proj.{kind}(Counter())""", step="""\
        h = torch.tanh(self.x)
        h = self.proj(h)  # SITE
        self.out.copy_(h)
        return self.out""")


def _hits(bad, file_name: str, line: int):
    return bad[(bad.category == "cpu-side-effect") & bad.file.str.endswith(file_name) & (bad.line == line)]


def test_a_library_hook_objects_change_has_the_module_call_as_caller(tmp_path, monkeypatch):
    mod, lib = install_library(tmp_path, monkeypatch, HOOK_LIB, "hook_lib")
    kind = random.choice(["register_forward_hook", "register_forward_pre_hook"])
    if kind == "register_forward_pre_hook":
        lib.write_text(lib.read_text().replace("args, output", "args"))
    path, site = write_target(tmp_path / "target" / "hook_target.py", HOOK_TARGET, mod=mod, kind=kind,
                              seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    hit = _hits(bad, lib.name, marked_line(lib, "# LIBSITE"))
    assert len(hit) == 1, table(bad)
    assert hit.iloc[0].caller_file.endswith(path.name) and int(hit.iloc[0].caller_line) == site, \
        hit[["caller_file", "caller_line"]].to_string()


PKG_COUNTERS = """
TOTALS = {"n": 0}


def count(n):
    TOTALS["n"] += n  # OWNSITE
"""

PKG_BLOCK = """
import torch
from torch import nn

from {pkg}.counters import count


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, h):
        count(h.shape[0])  # CALL
        return torch.tanh(self.proj(h))
"""

PKG_TARGET = module_target(imports="from {pkg}.block import Block", init="        self.block = Block({d})",
                           step="""\
        self.out.copy_(self.block(self.x))  # SITE
        return self.out""")


def test_an_own_helpers_global_change_is_its_own_caller(tmp_path):
    pkg = f"own_pkg_{random.randrange(10**9)}"
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    counters = tmp_path / pkg / "counters.py"
    counters.write_text(textwrap.dedent(PKG_COUNTERS))
    (tmp_path / pkg / "block.py").write_text(textwrap.dedent(PKG_BLOCK).format(pkg=pkg))
    path, _ = write_target(tmp_path / "split_target.py", PKG_TARGET, pkg=pkg, seed=random.randrange(2**31),
                           d=random.choice([4, 8]))
    try:
        bad = blocking(path)
    finally:
        for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
            sys.modules.pop(name)
    line = marked_line(counters, "# OWNSITE")
    hit = _hits(bad, f"{pkg}/counters.py", line)
    assert len(hit) == 1, table(bad)
    assert hit.iloc[0].caller_file.endswith(f"{pkg}/counters.py") and int(hit.iloc[0].caller_line) == line, \
        hit[["caller_file", "caller_line"]].to_string()
