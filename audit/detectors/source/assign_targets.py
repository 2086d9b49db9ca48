"""The places an assignment statement writes, with tuple and list targets unpacked.

`self.step, self.last = self.step + 1, name` and `_STATE["a"], _STATE["b"] = a, b` write two places in one
statement; the statement's `targets` list holds a single `ast.Tuple` for them. The source readers that look
for the statement that changed a name (cpu-side-effect's site) ask for each place written, so they read them
here, unpacked (also inside `[a, b] = ...`, nested tuples and a starred `*rest`).
"""

from __future__ import annotations

import ast

__all__ = ["flat", "written"]


def flat(targets) -> list:
    """Each name, attribute or subscript in `targets`, tuples, lists and starred targets unpacked."""
    out = []
    for t in targets:
        if isinstance(t, (ast.Tuple, ast.List)):
            out.extend(flat(t.elts))
        elif isinstance(t, ast.Starred):
            out.extend(flat([t.value]))
        else:
            out.append(t)
    return out


def written(node) -> list:
    """The places an Assign, AugAssign, AnnAssign or Delete statement writes (none for other nodes)."""
    if isinstance(node, (ast.Assign, ast.Delete)):
        return flat(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return flat([node.target])
    return []
