"""A plain object held in a container of a library object, changed by the holder's method.

A request table keeps one dataclass per request (`self.reqs[rid] = RequestState(...)`) and its method counts
decoded tokens with `self.reqs[rid].decoded += 1` (or through a local, `req = self.reqs[rid]; req.decoded += 1`).
The state snapshot names the change `table.reqs.0.decoded`; the statement reaches it through a subscript, and
must be the finding's line, with the target's call as caller (the method runs no torch op, so only its source
can name the line). A method that only reads the member is clean.
"""

from __future__ import annotations

import random

import pytest

from site_util import blocking, clean_or_hit, library_target

LIB = """
from dataclasses import dataclass


@dataclass
class Req:
    rid: int
    {field}: int = 0


class Table:
    def __init__(self, n):
        self.{box} = {make}

    def note(self, rid):
{body}
"""

BODIES = {
    "direct": "        self.{box}[rid].{field} += 1  # LIBSITE",
    "alias": "        req = self.{box}[rid]\n        req.{field} += 1  # LIBSITE",
    "read": "        n = self.{box}[rid].{field}  # LIBSITE",
}


@pytest.mark.parametrize("kind", ["direct", "alias", "read"])
def test_member_of_held_container(tmp_path, monkeypatch, kind):
    box, field = random.choice(["reqs", "slots", "table"]), random.choice(["decoded", "steps", "tokens"])
    make = random.choice(["{i: Req(i) for i in range(n)}", "[Req(i) for i in range(n)]"])
    src = LIB.format(box=box, field=field, make=make, body=BODIES[kind].format(box=box, field=field))
    n = random.randint(2, 4)
    mod, lib, path, site = library_target(tmp_path, monkeypatch, src, "held", "Table",
                                          f"self.tab.note({random.randrange(n)}) or self.x @ self.w",
                                          init=f"        self.tab = Table({n})")
    bad = blocking(path, forget=mod)
    clean_or_hit(bad, "clean" if kind == "read" else "hit", "cpu-side-effect", lib, path, site)
