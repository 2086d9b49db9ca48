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


EXECED = module_target(imports="from pathlib import Path", prelude="""
_ns = {{"__name__": "{name}", "torch": torch}}
_src = "def scale(h):\\n    return h * 0.5\\n\\ndef squash(h):\\n    return torch.tanh(scale(h))\\n"
# code run in a plain dict, as pytest-xdist's worker runs its loop: no module owns these globals
exec(compile(_src, str(Path(__file__).with_name("execd_code.py")), "exec"), _ns)
squash = _ns["squash"]
""", init="        self.w = torch.randn({d}, {d})", step="""\
        for _ in range({n}):
            self.out.copy_(squash(self.x @ self.w))  # SITE
        return self.out""")


def test_globals_no_module_owns_are_looked_up_once(tmp_path, monkeypatch):
    """A frame whose globals no module owns (exec'd code) is asked about once: finding a module's object from
    its globals walks the whole heap, and asking at every frame made each scan under pytest-xdist twice as slow."""
    import gc

    from audit.scan.sources import loaded

    asked = []
    real = gc.get_referrers
    monkeypatch.setattr(loaded.gc, "get_referrers", lambda *objs: asked.append(objs) or real(*objs), raising=False)
    name = f"execd_{random.randrange(10**9)}"
    path, _ = write_target(tmp_path / "execd_target.py", EXECED, name=name, seed=random.randrange(2**31),
                           d=random.choice([4, 8]), n=random.randint(3, 6))
    bad = blocking(path)
    assert not len(bad), table(bad)
    ours = [objs for objs in asked if any(isinstance(o, dict) and o.get("__name__") == name for o in objs)]
    assert len(ours) == 1, len(ours)
