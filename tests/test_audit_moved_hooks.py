"""A forward hook that prepare() moves to another layer is named at the hook, not at the layer loop.

Activation steering registers its hook on the request's layer between generations. The step's own lines run
the same in every step; torch runs the hook after another layer, so the op sequences differ, and the layer loop
around the calls decided nothing. The finding is the hook's line, naming the modules it ran at. A hook that stays
on its layer (the coefficient a device tensor refilled in place) is clean, and a hooked module the data skips
is still the skip's finding, not the hook's.
"""

from __future__ import annotations

import random

import pytest

from site_util import at, blocking, module_target, table, write_target

HOOK = """
    def _steer(self, module, inputs, output):
        return output + self.coef * self.vec  # SITE
"""


def _target(tmp_path, how: str):
    init = """        self.layers = nn.ModuleList(nn.Linear({d}, {d}) for _ in range({n}))
        self.vec = torch.randn({d})
        self.coef = torch.full((), 2.0)
        self.handle = self.layers[1].register_forward_hook(self._steer)"""
    prepare = {
        "moved": """        self.handle.remove()
        self.handle = self.layers[i % {n}].register_forward_hook(self._steer)""",
        "kept": """        self.coef.fill_(float(torch.rand(())) * 4)""",
        "skipped": """        self.depth = 1 + i % {n}""",
    }[how]
    loop = "self.layers[: self.depth]" if how == "skipped" else "self.layers"
    step = f"""        h = self.x
        for layer in {loop}:  # LOOP
            h = torch.tanh(layer(h))
        self.out.copy_(h)
        return self.out"""
    tpl = module_target(init=init, prepare=prepare, step=step).replace("\n    def prepare", HOOK + "\n    def prepare")
    if how == "skipped":
        tpl = tpl.replace("        self.x = torch.zeros", "        self.depth = 1\n        self.x = torch.zeros")
    path, site = write_target(tmp_path / f"steer_{how}.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]), n=random.choice([3, 4]))
    loop_line = next(k for k, t in enumerate(path.read_text().splitlines(), 1) if "# LOOP" in t)
    return path, site, loop_line


def test_a_hook_moved_to_another_layer_is_named_at_the_hook(tmp_path):
    path, site, loop = _target(tmp_path, "moved")
    bad = blocking(path)
    hit = at(bad, "data-dependent-control", site)
    assert len(hit) == 1, table(bad)
    assert "_steer" in hit.iloc[0].message and "layers." in hit.iloc[0].message, hit.iloc[0].message
    assert not len(at(bad, "data-dependent-control", loop)), table(bad)


def test_a_hook_kept_on_its_layer_is_clean(tmp_path):
    path, _site, _loop = _target(tmp_path, "kept")
    bad = blocking(path)
    assert not len(bad), table(bad)


@pytest.mark.parametrize("how", ["skipped"])
def test_a_hooked_layer_the_loop_skips_is_the_loops_finding(tmp_path, how):
    path, site, loop = _target(tmp_path, how)
    bad = blocking(path)
    assert len(at(bad, "data-dependent-control", loop)) == 1, table(bad)
    assert not len(at(bad, "data-dependent-control", site)), table(bad)
