"""A library hook object called by name from a wrapper that replaced the module's forward: the target's call is caller.

accelerate's `add_hook_to_module` keeps a hook object on the module (`module._hf_hook`) and replaces
`module.forward` with a partial of `new_forward`, which calls `module._hf_hook.pre_forward(...)`. A hook
that counts forwards on itself runs no torch op, so no op record has its frame; the finding's caller was
the library's own line. The wrapper that calls it by name ran ops: the target's line that led into that
wrapper is the caller. A hook that keeps no state stays clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, module_target, write_target

LIB = """
import functools


class Hook:
    def __init__(self):
        self.calls = 0
        self.seen = []

    def pre_forward(self, module, *args):
        {line}
        return args


def add_hook_to_module(module, hook):
    old_forward = module.forward
    module._hf_hook = hook

    def new_forward(module, *args):
        args = module._hf_hook.pre_forward(module, *args)
        return old_forward(*args)

    module.forward = functools.update_wrapper(functools.partial(new_forward, module), old_forward)
    return module
"""

LINES = {
    "counter": "self.calls += 1  # LIBSITE",
    "list": "self.seen.append(len(args))  # LIBSITE",
    "clean": "args = tuple(args)  # LIBSITE",
}

TARGET = module_target(imports="from {mod} import Hook, add_hook_to_module", init="""\
        self.lin = nn.Linear({d}, {d})
        add_hook_to_module(self.lin, Hook())""", step="""\
        h = torch.relu(self.x)
        h = self.lin(h)  # SITE
        self.out.copy_(h)
        return self.out""")


@pytest.mark.parametrize("kind", sorted(LINES))
def test_a_hook_object_called_by_a_wrapped_forward(tmp_path, monkeypatch, kind):
    mod, lib = install_library(tmp_path, monkeypatch, LIB.replace("{line}", LINES[kind]), "attach_lib")
    path, site = write_target(tmp_path / "target" / "attach_target.py", TARGET, mod=mod,
                              seed=random.randrange(2**31), d=random.choice([4, 8, 16]))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, kind, "cpu-side-effect", lib, path, site)
