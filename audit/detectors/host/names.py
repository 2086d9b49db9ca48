"""The values a plain name in a host computation can hold, so that a constant or a local does not hide host memory.

`inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))` then `self.inv_freq = inv` (rotary frequencies kept
as a plain attribute, as Keras layers and hand-written decoders do): `D` is a module-level number and `inv` a
local bound to a host computation, neither of which can bring a device in. A name that is anything else (a
parameter, a global bound to an object, a local assigned more than one way or after the read) stays unknown.
"""

from __future__ import annotations

import ast

from audit.detectors.source import scopes
from audit.detectors.source.lookup import tree


def _number(v) -> bool:
    return isinstance(v, ast.Constant) and isinstance(v.value, (int, float)) and not isinstance(v.value, bool)


def bound_values(filename: str, name: ast.Name) -> list | None:
    """The expressions `name` is assigned where it is read (`scopes.values`): a local's plain assignments, all
    before the read, else a module-level number (`D = 64`); None when neither settles it."""
    t, line = tree(filename), getattr(name, "lineno", 0)
    found = scopes.values(t, name, line) if t is not None else None
    if not found or any(ln >= line for _, ln in found):
        return None
    func, _ = scopes.owners(t, line)
    local = func is not None and all(scopes._span(func, ln) for _, ln in found)
    return [v for v, _ in found] if local or all(_number(v) for v, _ in found) else None
