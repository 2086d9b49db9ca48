"""A module global changed from a sibling module, through the name the sibling binds the module to
(`from lib import state as st`, then `st.STATS["calls"] += 1`): the cpu-side-effect is that sibling's
statement, with the target's call as caller, not an unplaced `<python state>` row. A counter changed only
in prepare() is no finding."""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, matmul_target, table, write_target

STATE = """
STATS = {"calls": 0, "rows": 0}
TRACE = []
"""

USER = """
import torch
import {state} as {alias}

def reduce(x, how):
    y = torch.tanh(x) * {k}
    if how == "dict":
        {alias}.STATS["calls"] += 1  # LIBSITE-dict
    elif how == "list":
        {alias}.TRACE.append(tuple(y.shape))  # LIBSITE-list
    return y

def bump():
    {alias}.STATS["rows"] += 1
"""


@pytest.mark.parametrize("how", ["dict", "list", "prepare"])
def test_a_global_changed_through_a_module_alias_is_sited_in_the_sibling(tmp_path, monkeypatch, how):
    alias = random.choice(["ps", "state", "_st"])
    state, _ = install_library(tmp_path, monkeypatch, STATE, prefix="state")
    user, lib = install_library(tmp_path, monkeypatch, USER.format(state=state, alias=alias, k=random.choice([1, 2, 3])),
                                prefix="comm")
    tpl = matmul_target(imports=f"from {user} import reduce, bump", step=f"""        y = reduce(self.x @ self.w, "{how}")  # SITE
        self.out.copy_(y)
        return self.out""", prepare="        bump()" if how == "prepare" else "")
    path, site = write_target(tmp_path / "target" / "mod_refs.py", tpl, seed=random.randrange(2**31),
                              d=random.choice([4, 8]))
    try:
        bad = blocking(path, forget=user)
    finally:
        import sys
        sys.modules.pop(state, None)
    if how == "prepare":
        assert not len(bad), table(bad)
        return
    library_hit(bad, "cpu-side-effect", lib, path, site, marker=f"# LIBSITE-{how}")
    assert len(bad) == 1, table(bad)
