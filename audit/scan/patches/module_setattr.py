"""nn.Module.__setattr__ during an audited step: each assignment becomes a 'setattr' event at the line that made it.

Side effects on modules (a counter bumped with `self.n += 1`) are reported where the assignment was written.
A class may put its own `__setattr__` in front of nn.Module's (torchmetrics' Metric guards its constants that
way) and forward to it: the event then belongs to the line that called the override, not to its `super()`
call, unless the override assigned another attribute itself (that one is its own line's).
"""

from __future__ import annotations

import sys

__all__ = ["wrapper"]


def _forwarding_depth(name: str) -> int:
    """record_event's frame depth of the line that assigned `name` (2: the caller of the patched __setattr__),
    past each `__setattr__` frame that forwards that same name."""
    f, depth = sys._getframe(2), 2
    while f.f_code.co_name == "__setattr__" and f.f_back is not None and f.f_code.co_argcount >= 2 \
            and f.f_locals.get(f.f_code.co_varnames[1]) == name:
        f, depth = f.f_back, depth + 1
    return depth


def wrapper(orig, active):
    """nn.Module.__setattr__ recording to the tracer `active()` returns (None outside a scan)."""
    def __setattr__(self, name, value):
        tr = active()
        if tr is not None and tr._step >= 0:
            tr.record_event("setattr", "setattr", note=f"{tr.path_of(self)}\x00{name}", depth=_forwarding_depth(name))
        orig(self, name, value)

    __setattr__.__wrapped__ = orig
    return __setattr__
