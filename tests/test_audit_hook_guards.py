"""A process-wide hook that picks its modules by what they carry, not their class.

A library's `register_module_forward_pre_hook` runs at every module call, and counts only under
`if getattr(mod, "_adapter_name", None) is not None:` (or `hasattr(mod, "lora_A")`, a name in a set): its
statement runs at the calls of the tagged modules only, so the target's call of the tagged module is the caller
of what it changes, not the first module call of the step. A test made of reads alone is evaluated on each hooked
call's module; with no tagged module the hook changes nothing and is no finding.
"""

from __future__ import annotations

import pytest

from site_util import blocking, clean_or_hit, install_library, module_target, write_target

LIB = """
import torch

COUNTS = {"tagged": 0, "lora": 0}
WANTED = {"Bilinear"}

def tagged(mod, args):
    if getattr(mod, "_adapter_name", None) is not None:
        COUNTS["tagged"] += 1  # LIBSITE tagged

def lora(mod, args):
    if hasattr(mod, "lora_rank") and type(mod).__name__ not in WANTED:
        COUNTS["lora"] += 1  # LIBSITE lora

def install(which):
    hook = {"tagged": tagged, "lora": lora}.get(which)
    return torch.nn.modules.module.register_module_forward_pre_hook(hook) if hook else None
"""


@pytest.mark.parametrize("how", ["tagged", "lora", "clean"])
def test_a_global_hook_guarded_by_an_attribute_counts_at_the_tagged_modules_call(tmp_path, monkeypatch, how):
    mod, lib = install_library(tmp_path, monkeypatch, LIB, prefix="guards")
    tag = {"tagged": 'self.b._adapter_name = "de"', "lora": "self.b.lora_rank = 4"}.get(how, "pass")
    init = f"""        self.a = torch.nn.Linear({{d}}, {{d}})
        self.b = torch.nn.Linear({{d}}, {{d}})
        {tag}
        self.handle = install("{how if how != 'clean' else 'tagged'}")"""
    tpl = module_target(imports=f"from {mod} import install", init=init, step="""        h = torch.tanh(self.a(self.x))
        h = self.b(h)  # SITE
        self.out.copy_(h)
        return self.out""")
    import random
    path, site = write_target(tmp_path / "target" / "lib_guards.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8, 16]))
    try:
        bad = blocking(path, forget=mod)
    finally:  # the hook the target installed, process-wide: removed with the library
        from torch.nn.modules import module as m
        for k, h in list(m._global_forward_pre_hooks.items()):
            if getattr(h, "__module__", None) == mod:
                del m._global_forward_pre_hooks[k]
    clean_or_hit(bad, how, "cpu-side-effect", lib, path, site, marker=f"# LIBSITE {how}")
