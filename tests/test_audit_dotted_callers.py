"""The target's call of a library method that runs no torch op, as the caller of its state change.

A library's class keeps a store on the class and a classmethod fills it, running no torch op
(`SharedStore.put(key, t)`: `cls._store[key] = t`). The target's step (decorated `@torch.no_grad()`, as decode
steps are) calls it through the module and the class (`lib.SharedStore.put(...)`: the dotted callee is resolved
in the target's globals) or through an attribute holding the class (`self.reg.put(...)`: the call is found by
name in the step's function, whose def starts at its decorator). That line must be the finding's caller, not
the library's own line. A method that leaves the store alone is clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, install_library, module_target, write_target

LIB = """
class {cls}:
    {store} = {{}}
    count = 0

    @{kind}
    def {meth}({first}key, t):
{body}
        return t
"""

BODIES = {
    "classmethod": "        cls.{store}[key] = t  # LIBSITE",
    "staticmethod": "        {cls}.count += 1  # LIBSITE",
    "clean": "        n = len({cls}.{store})  # LIBSITE",
}


@pytest.mark.parametrize("form", ["dotted", "held"])
@pytest.mark.parametrize("kind", ["classmethod", "staticmethod", "clean"])
def test_dotted_callee_caller(tmp_path, monkeypatch, kind, form):
    cls, store = random.choice(["SharedStore", "Registry", "FeatureBank"]), random.choice(["_store", "entries"])
    meth = random.choice(["put", "remember", "keep"])
    deco = "classmethod" if kind == "classmethod" else "staticmethod"
    src = LIB.format(cls=cls, store=store, kind=deco, meth=meth, first="cls, " if deco == "classmethod" else "",
                     body=BODIES[kind].format(cls=cls, store=store))
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="dotted")
    alias = random.choice(["lib", "store_mod"])
    callee = f"{alias}.{cls}.{meth}" if form == "dotted" else f"self.reg.{meth}"
    tpl = module_target(imports=f"import {mod} as {alias}", prepare="        self.k = i", step=f"""        y = {callee}(self.k, self.x * 2.0)  # SITE
        self.out.copy_(y)
        return self.out""", init=f"        self.k = 0\n        self.reg = {alias}.{cls}")
    path, site = write_target(tmp_path / "target" / "dotted.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "clean" if kind == "clean" else "hit", "cpu-side-effect", lib, path, site)
