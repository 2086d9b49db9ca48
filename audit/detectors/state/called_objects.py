"""Library objects the target calls by syntax alone, whose `__call__` ran no torch op.

A speculative-acceptance object kept on the target (`self.acc = HostCoinAcceptance(0.5)`) and called as
`self.acc(draft, target)` runs its `__call__` in the step, yet with no torch op inside it the trace holds no
frame of it: a rule reading the source of the functions that ran never opens it. Its class is found from
the objects the target holds (an attribute, or a member of a list or dict attribute: `self.accs[0](d, t)`), and
the target's line that calls it, or hands it to a call (`speculate(self.acc, d, t)`, a library function calling
its parameter), in a function that ran in the step, is the caller.
"""

from __future__ import annotations

import ast
import inspect

from audit.detectors.source.lookup import tree
from audit.scan.sources.ast_nodes import nodes_of
from audit.scan.sources.user_code import LIBRARY, frame_kind

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _library_call(obj):
    """The code of the `__call__` the object's class defines in a library's Python file (None: none, or the
    class is the target's own, torch's or the stdlib's)."""
    fn = inspect.getattr_static(type(obj), "__call__", None)
    code = getattr(fn, "__code__", None)
    return code if code is not None and frame_kind(code.co_filename, ()) == LIBRARY else None


def _holds(n, attr: str) -> bool:
    """`<x>.attr`, or a member of it (`<x>.attr[k]`)."""
    if isinstance(n, ast.Subscript):
        n = n.value
    return isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.value, ast.Name)


def _uses(filename: str, attr: str) -> list[tuple[int, str]]:
    """(line, function) of the calls in `filename` that call the object held in `<x>.attr` (or a member of it),
    or hand it over as an argument."""
    t = tree(filename)
    out = []
    for func in nodes_of(t, _FUNCS) if t is not None else ():
        name = getattr(func, "name", "<lambda>")
        for n in ast.walk(func):
            if isinstance(n, ast.Call) and (_holds(n.func, attr) or any(
                    _holds(a, attr) for a in n.args + [k.value for k in n.keywords])):
                out.append((n.lineno, name))
    return sorted(set(out))


def draws(ctx, own: set, codes, sites) -> dict:
    """{(file, line, fn, *what): caller}: the sites `sites(file, first_line, fn)` finds in the `__call__` of an
    object the target holds, for each such object the target's code that ran in the step calls or hands over;
    the caller is that line."""
    ran = {(c.co_filename, c.co_name) for c in codes if c.co_filename in own}
    out = {}
    for path, obj in ctx.trace.objects:
        code = _library_call(obj) if path else None
        if code is None or code.co_filename in own:
            continue
        holder = path.split(".")[0]  # the target's attribute: the object, or the list / dict holding it
        uses = [(f, line, fn) for f in sorted(own) for line, fn in _uses(f, holder) if (f, fn) in ran]
        if not uses:
            continue
        for hit in sites(code.co_filename, code.co_firstlineno, code.co_name):
            out.setdefault((code.co_filename, *hit), uses[0])
    return out
