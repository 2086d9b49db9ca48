"""The plain numbers a function's module binds at module level (`BS = 16`, `MAX_LEN = 4096`).

A counter branch's test is run forward over the steps ahead (counter_branches.py). Tests written against a module
constant (`if pos % BS == 0:` for a paged cache's block boundary, `if self.pos >= MAX_LEN:`) could not be read
that way without the constant's value, and were then judged only by their shape (a comparison "turns"), so a
test the audited steps had already walked both ways looked like one that never turned. The value the module holds
now is the value the test reads: a global the step changes is a counter, found before this is asked.
"""

from __future__ import annotations

import numbers

from audit.scan.sources import loaded


def module_numbers(code) -> dict:
    """name -> value of the plain numbers (not bools) in the globals of the module that defines `code`."""
    mod = loaded.module_in(code.co_filename)
    if mod is None:
        return {}
    return {k: v for k, v in vars(mod).items()
            if isinstance(v, numbers.Real) and not isinstance(v, bool) and not k.startswith("__")}
