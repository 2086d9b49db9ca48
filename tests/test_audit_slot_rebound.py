"""A dict or list slot rebound to a tensor the step allocated a line or more before
(`t = torch.tanh(h); self.slots["h"] = t`), read by the next step: one finding, step-allocation's escape at
the allocating line (the slot named as its holder), not a second cpu-side-effect at the rebinding line. A
slot rebound to a tensor made outside the step (a pool row picked by a host index) is still a change of
Python state, at the rebinding line.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, install_library, library_hit, marked_line, matmul_target, table, write_target

HOLDERS = {"dict": ("{}", '["h"]', 'self.slots.get("h")'),
           "list": ("[None]", "[0]", "self.slots[0]")}

LIB = """
import torch

class Keeper:
    def __init__(self):
        self.slots = {empty}
        self.pool = [torch.zeros(1, {d}) for _ in range(3)]

    def last(self):
        return {last}

    def keep(self, h):
        t = torch.tanh(h){alloc_mark}
        {gap}
        self.slots{key} = {value}{rebind_mark}
        return t
"""


def _scan(tmp_path, monkeypatch, holder: str, fresh: bool):
    empty, key, last = HOLDERS[holder]
    d = random.choice([4, 8, 16])
    lib_src = LIB.format(empty=empty, key=key, last=last, d=d, gap=random.choice(["pass", "h = None"]),
                         alloc_mark="  # LIBSITE" if fresh else "",
                         value="t" if fresh else "self.pool[self.k % 3]", rebind_mark="  # REBIND")
    if not fresh:
        lib_src = lib_src.replace("self.slots = ", "self.k = 0\n        self.slots = ")
    mod, lib = install_library(tmp_path, monkeypatch, lib_src, prefix="keeper")
    tpl = matmul_target(imports=f"from {mod} import Keeper", init="        self.keep = Keeper()",
                        prepare="        self.keep.k = i" if not fresh else "",
                        step="""        prev = self.keep.last()
        h = torch.tanh(self.x @ self.w)
        if prev is not None:
            h = h + prev
        self.out.copy_(self.keep.keep(h))  # SITE
        return self.out""")
    path, site = write_target(tmp_path / "target" / "keeper_target.py", tpl, seed=random.randrange(2**31), d=d)
    return blocking(path, forget=mod), lib, path, site


@pytest.mark.parametrize("holder", sorted(HOLDERS))
def test_a_slot_rebound_to_a_step_allocation_is_one_escape(tmp_path, monkeypatch, holder):
    bad, lib, path, site = _scan(tmp_path, monkeypatch, holder, fresh=True)
    library_hit(bad, "step-allocation", lib, path, site)
    assert not len(bad[bad.category == "cpu-side-effect"]), table(bad)


@pytest.mark.parametrize("holder", sorted(HOLDERS))
def test_a_slot_rebound_to_another_pool_row_is_still_a_side_effect(tmp_path, monkeypatch, holder):
    bad, lib, path, site = _scan(tmp_path, monkeypatch, holder, fresh=False)
    hit = bad[(bad.category == "cpu-side-effect") & bad.file.str.endswith(lib.name) &
              (bad.line == marked_line(lib, "# REBIND"))]
    assert len(hit) == 1, table(bad)
