"""The values a plain name in a host computation can hold, so that a constant or a local does not hide host memory.

`inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))` then `self.inv_freq = inv` (rotary frequencies kept
as a plain attribute, as Keras layers and hand-written decoders do): `D` is a module-level number and `inv` a
local bound to a host computation, neither of which can bring a device in. A name that is anything else (a
parameter, a global bound to an object, a local assigned more than one way) stays unknown.
"""

from __future__ import annotations

import ast

from audit.detectors._source import enclosing_function, tree


def bound_values(filename: str, name: ast.Name) -> list | None:
    """The expressions `name` is assigned where it is read: the assignments of a local of the enclosing function
    before the read, else a module-level number (`D = 64`); None when neither settles it."""
    t = tree(filename)
    if t is None:
        return None
    func = enclosing_function(filename, getattr(name, "lineno", 0))
    if func is not None and not isinstance(func, ast.Module):
        args = func.args
        if name.id in {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}:
            return None
        local = _assigned(func, name.id)
        if local is not None:
            before = [v for line, v in local if line < name.lineno]
            return before if before and len(before) == len(local) else None
    glob = _assigned(t, name.id, top=True)
    if glob and all(isinstance(v, ast.Constant) and isinstance(v.value, (int, float)) and not isinstance(v.value, bool)
                    for _, v in glob):
        return [v for _, v in glob]
    return None


def _assigned(scope, name: str, top: bool = False) -> list | None:
    """(line, value) of each plain `name = value` in `scope` (its top-level statements only when `top`); None
    when the name is never stored there; a store of another kind (`for name in`, `name += 1`) gives []."""
    nodes = scope.body if top else ast.walk(scope)
    found, other = [], False
    for n in nodes:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) \
                and n.targets[0].id == name:
            found.append((n.lineno, n.value))
        elif not top and isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store):
            other = True
    stores = len(found)
    if not top:  # every Name store of `name` must be one of the plain assignments
        stores = sum(1 for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store))
        if stores != len(found):
            return []
    return found if (found or other) else None
