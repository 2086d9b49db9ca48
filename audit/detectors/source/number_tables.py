"""Containers of plain numbers a counter test looks its counter up in (`if self.pos in self.forced:`).

A template forcing tokens at fixed output positions (`{0: BOS, 12: SEP, 24: SEP}`), checkpoints at fixed steps
(`SAVE_AT = (100, 1000)`): the test is a membership test of the counter in a table of numbers, and it turns when
the counter reaches the next entry. Read as a set of its numbers (a dict's keys), the test runs forward like a
comparison (counter_branches.py). What the table holds now is what the test reads: one the step grows
(`self.seen.add(self.n)`) holds every past value and none ahead, so `self.n in self.seen` never turns, as before.
"""

from __future__ import annotations

import numbers

from audit.scan.sources import loaded

_MAX = 4096  # entries read


def number_table(v):
    """The numbers a dict's keys, a set, tuple, list or range holds, as a frozenset; else None."""
    if isinstance(v, range):
        return frozenset(v) if len(v) <= _MAX else None
    items = list(v.keys()) if isinstance(v, dict) else list(v) if isinstance(v, (set, frozenset, tuple, list)) \
        else None
    if items is None or len(items) > _MAX or not all(
            isinstance(x, numbers.Real) and not isinstance(x, bool) for x in items):
        return None
    return frozenset(items)


def module_tables(code) -> dict:
    """name -> number_table of the containers of numbers the module that defines `code` binds at module level."""
    mod = loaded.module_in(code.co_filename)
    out = {}
    for k, v in (vars(mod).items() if mod is not None else ()):
        if not k.startswith("__") and isinstance(v, (dict, set, frozenset, tuple, list, range)) and \
                (t := number_table(v)) is not None:
            out[k] = t
    return out
