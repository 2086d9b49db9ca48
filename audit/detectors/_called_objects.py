"""Library objects the target calls by syntax alone, whose `__call__` ran no torch op.

A speculative-acceptance object kept on the target (`self.acc = HostCoinAcceptance(0.5)`) and called as
`self.acc(draft, target)` runs its `__call__` in the step, yet with no torch op inside it the trace holds no
frame of it: a rule reading the source of the functions that ran never opens it. Its class is found from
the objects the target holds, and the target's line that calls the attribute (`_implicit.implicit_uses`), in
a function that ran in the step, is the caller.
"""

from __future__ import annotations

import inspect

from audit.detectors import _implicit
from audit.scan.user_code import LIBRARY, frame_kind


def _library_call(obj):
    """The code of the `__call__` the object's class defines in a library's Python file (None: none, or the
    class is the target's own, torch's or the stdlib's)."""
    fn = inspect.getattr_static(type(obj), "__call__", None)
    code = getattr(fn, "__code__", None)
    return code if code is not None and frame_kind(code.co_filename, ()) == LIBRARY else None


def draws(ctx, own: set, codes, sites) -> dict:
    """{(file, line, fn, *what): caller}: the sites `sites(file, first_line, fn)` finds in the `__call__` of an
    object the target holds, for each such object the target's code that ran in the step calls as
    `<x>.<attr>(...)`; the caller is that line."""
    ran = {(c.co_filename, c.co_name) for c in codes if c.co_filename in own}
    out = {}
    for path, obj in ctx.trace.objects:
        code = _library_call(obj) if path else None
        if code is None or code.co_filename in own:
            continue
        holder = path.rsplit(".", 1)[-1]
        uses = [(f, line, fn) for f in sorted(own) for line, fn in _implicit.implicit_uses(f, holder, "__call__")
                if (f, fn) in ran]
        if not uses:
            continue
        for hit in sites(code.co_filename, code.co_firstlineno, code.co_name):
            out.setdefault((code.co_filename, *hit), uses[0])
    return out
