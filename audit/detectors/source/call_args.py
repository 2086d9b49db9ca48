"""The argument a caller's call binds to one parameter of the function it called.

Rules that follow a value out through parameters (a skipped loop's index handed to a helper, a host position
handed down a model's layers) need, for a callee's parameter, the expression the calling line passed for it.
The call is found at the caller's line by the callee's name; a module's `forward` is also reached through the
module itself (`self.attn(x, start_pos)`, `layer(h, start_pos)` run `forward` by `__call__`), so for a callee
named `forward` every call on the line is a candidate, and one that passes too few arguments drops out.
"""

from __future__ import annotations

import ast

from audit.detectors.source import lookup
from audit.scan.sources.ast_nodes import calls_at


def _positional(callee) -> list:
    a = callee.args
    return [p.arg for p in (*a.posonlyargs, *a.args)]


def bound_args(caller_file: str, caller_line: int, callee, name: str) -> list | None:
    """The argument expressions the call(s) of `callee` on `caller_line` bind to parameter `name`; None when no
    call there can be matched to `callee`."""
    t = lookup.tree(caller_file)
    if t is None or not isinstance(callee, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    params = _positional(callee)
    kwonly = {p.arg for p in callee.args.kwonlyargs}
    found = None
    for call in calls_at(t, caller_line):
        f = call.func
        called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        through_module = callee.name == "forward" and called != "forward"
        if called != callee.name and not through_module:
            continue
        # a method called through an attribute (or a module through __call__) binds self implicitly
        bound_self = (isinstance(f, ast.Attribute) or through_module) and params and params[0] in ("self", "cls")
        pos = params[1:] if bound_self else params
        args = []
        if name in pos and pos.index(name) < len(call.args):
            arg = call.args[pos.index(name)]
            if not isinstance(arg, ast.Starred):
                args.append(arg)
        args += [kw.value for kw in call.keywords if kw.arg == name and (name in pos or name in kwonly)]
        if through_module and not args:
            continue  # another call on the line (`self.attn_norm(x)` inside `self.attn(...)`)
        found = (found or []) + args
    return found
