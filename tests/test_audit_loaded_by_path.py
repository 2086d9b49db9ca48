"""Own code loaded by path (`importlib.util.spec_from_file_location` + `exec_module`) never enters
sys.modules; its globals are still Python state the step changes, and a replay never changes them."""

from __future__ import annotations

import random
import textwrap

from site_util import blocking, marked_line, module_target, table, write_target

HELPER = """
import torch

{glob} = [0]


def {fn}(h):
    {glob}[0] += 1  # OWNSITE
    return torch.tanh(h)
"""

TARGET = module_target(imports="import importlib.util\nfrom pathlib import Path", prelude="""
_spec = importlib.util.spec_from_file_location("{mod}", Path(__file__).parent / "{helper}.py")
helper = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helper)
""", init="        self.w = torch.randn({d}, {d})", step="""\
        self.out.copy_(helper.{fn}(self.x @ self.w))  # SITE
        return self.out""")


def test_a_helper_loaded_by_path_has_its_global_change_found(tmp_path):
    tag = random.randrange(10**9)
    glob, fn, helper_name = f"SEEN_{tag}", f"squash_{tag}", f"rules_{tag}"
    helper = tmp_path / f"{helper_name}.py"
    helper.write_text(textwrap.dedent(HELPER).format(glob=glob, fn=fn))
    path, _ = write_target(tmp_path / "by_path_target.py", TARGET, mod=f"loaded_{tag}", helper=helper_name, fn=fn,
                           seed=random.randrange(2**31), d=random.choice([4, 8]))
    bad = blocking(path)
    hit = bad[(bad.category == "cpu-side-effect") & bad.file.str.endswith(helper.name)
              & (bad.line == marked_line(helper, "# OWNSITE"))]
    assert len(hit) == 1, table(bad)
