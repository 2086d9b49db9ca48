"""Where a tensor made in a callee escapes: the step's own assignment that keeps it.

A recurrent policy's forward returns a fresh hidden state and value; the step keeps them with `self.h = h.detach()`
and `self.prev_value = value`, and the next step reads them back. The allocation is inside the model's forward,
which returns a new tensor by design and is not where anything changes; the fix (a preallocated buffer refilled with
`self.h.copy_(h)`) goes at the step's assignment. So when the function that allocated the tensor is not the one that
assigns its holder, and the target's own functions that ran in that step (or that they call by name: a helper
`self.keep(value)` that only assigns runs no op) assign the holder's attribute in exactly one plain statement
(`x.h = ...`), that statement is the escape's site. An allocation on the assigning line itself, or in
the same function (`t = torch.tanh(h); self.h = t`), keeps its own line: the allocation can be written in place there.
So does an allocation made while the assignment itself ran (`self.k = grow(self.k, x)`, `self.h, self.c =
cell(x, self.h, self.c)`): its finding already names that statement as its caller (or is the caller's own line).
"""

from __future__ import annotations

import ast

from audit.detectors.source.assign_targets import written
from audit.detectors.source.lookup import _FUNC, function_node, tree
from audit.scan.sources.ast_nodes import all_nodes

__all__ = ["store_site"]


def _assignments(filename: str, functions: set, name: str) -> list:
    """(file, line, function, last line) of the plain assignments `<x>.name = ...` in the named functions of a file."""
    t = tree(filename)
    if t is None:
        return []
    out = []
    for func in all_nodes(t):
        if not isinstance(func, _FUNC) or getattr(func, "name", None) not in functions:
            continue
        for node in ast.walk(func):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                    isinstance(x, ast.Attribute) and x.attr == name for x in written(node)):
                out.append((filename, node.lineno, func.name, getattr(node, "end_lineno", None) or node.lineno))
    return out


def _ran(ctx, step: int) -> dict:
    """file -> names of the target's own functions that ran in the step (on an op's stack), and of the functions
    they call by name, looked up in the same files: a helper that only assigns (`self.keep(value)` ->
    `self.prev = v`) runs no op and is on no stack."""
    codes = {code for r in ctx.steps[step] for code, _ in r.stack if ctx.trace.is_own(code)}
    called = set()
    for code in codes:
        node = function_node(code)
        called |= {getattr(n.func, "attr", getattr(n.func, "id", None)) for n in ast.walk(node)
                   if isinstance(n, ast.Call)} if node is not None else set()
    out: dict = {}
    for code in codes:
        out.setdefault(code.co_filename, set()).add(code.co_name)
    for names in out.values():
        names |= called - {None, "__init__", "prepare"}
    return out


def store_site(ctx, alloc, holder: str | None):
    """(file, line, function) of the step's assignment that keeps the escaped allocation `alloc` in `holder`
    (an attribute path, `h` or `policy.state`), or None: no plain attribute holder, no single assignment of
    it among the target's functions that ran, or the allocation made in the assigning function itself."""
    if not holder or alloc.frame is None:
        return None
    name = holder.split(".")[-1]
    if not name.isidentifier():
        return None  # a list or dict slot (`slots["h"]`): the allocation's line is reported
    ran = _ran(ctx, alloc.step)
    sites = sorted({s for file, fns in ran.items() for s in _assignments(file, fns, name)})
    if len(sites) != 1:
        return None
    file, line, fn, last = sites[0]
    made_file, made_line, made_fn = alloc.frame[:3]
    if (file, fn) == (made_file, made_fn):
        return None
    if any(code.co_filename == file and line <= at <= last for code, at in alloc.stack):
        return None  # `self.h, self.c = cell(x, self.h, self.c)`: made while this statement ran, which its caller names
    return file, line, fn
