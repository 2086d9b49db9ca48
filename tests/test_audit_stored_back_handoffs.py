"""A dict handed to a library method that changes it and returns it, stored back by the target.

`self.kw = self.model.update_model_kwargs(self.kw, t)` (transformers' generation loop) hands the dict to the
library, which advances `model_kwargs["cur_len"]` under its own name and returns the same dict. The target's
store puts the same object back; the change was made at the library's statement, which is the site, with the
target's line as caller. A library that returns a new dict (`{**kw, "cur_len": ...}`) changes nothing it was
handed: then the target's store, which rebinds the attribute, is the site."""

from __future__ import annotations

import random

import pytest
from site_util import blocking, install_library, library_hit, matmul_target, table, write_target

LIB = """
import torch


class Model:
    def __init__(self):
        self.scale = torch.ones(1)

    def update_model_kwargs(self, model_kwargs, y):
        {mbody}
        return model_kwargs


def update_kwargs(model_kwargs, y):
    {fbody}
    return model_kwargs
"""

BODIES = {"in-place": ['model_kwargs["cur_len"] = model_kwargs.get("cur_len", 0) + 1  # LIBSITE',
                       'model_kwargs["cur_len"] += 1  # LIBSITE'],
          "new": ['model_kwargs = {**model_kwargs, "cur_len": model_kwargs["cur_len"] + 1}  # LIBSITE']}


@pytest.mark.parametrize("kind", ["in-place", "new"])
@pytest.mark.parametrize("how", ["method", "function"])
def test_store_back_of_a_handed_dict(tmp_path, monkeypatch, kind, how):
    body = random.choice(BODIES[kind])
    other = 'model_kwargs = model_kwargs'  # the function not called: no marker, changes nothing
    src = LIB.replace("{mbody}", body if how == "method" else other).replace("{fbody}", body if how == "function" else other)
    mod, lib = install_library(tmp_path, monkeypatch, src, prefix="kwlib")
    call = "self.model.update_model_kwargs(self.kw, y)" if how == "method" else "update_kwargs(self.kw, y)"
    tpl = matmul_target(imports=f"from {mod} import Model, update_kwargs",
                        init=f"        self.model = Model()\n        self.kw = {{{{'cur_len': {random.randint(0, 9)}}}}}",
                        step=f"        y = self.x @ self.w\n        self.kw = {call}  # SITE\n"
                             "        self.out.copy_(y)\n        return self.out")
    path, site = write_target(tmp_path / "target" / "kw_target.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8]))
    bad = blocking(path, forget=mod)
    if kind == "in-place":
        library_hit(bad, "cpu-side-effect", lib, path, site)
    else:
        hit = bad[(bad.category == "cpu-side-effect") & bad.file.str.endswith(path.name) & (bad.line == site)]
        assert len(hit) == 1, table(bad)
