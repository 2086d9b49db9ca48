"""cpu-side-effect: a pinned staging buffer handed to a helper that fills it through a numpy view.

xgrammar-style grammar matchers fill a packed token bitmask for the next step into a buffer they are given:
`self.matcher.fill_next_token_bitmask(self.bitmask_cpu)`, whose body writes `out.numpy()[0, :] = packed`. The
write runs no torch op, so the helper is on no op's stack, and it names the buffer by its parameter, not by the
attribute the target keeps it in. A call in a function that ran, passing `<x>.attr` to a function it resolves to
(a module function, or a method of an object the running method's object holds: `self.matcher.<method>`), is
followed into that function's source, where the writes through a view of the parameter are the sites, with the
handing call as caller (staging_refill reports them).
"""

from __future__ import annotations

import ast
import contextlib
import inspect

from audit.detectors.state import handoff, sites as _state_sites

__all__ = ["handed_writes"]


def _held(ctx, code) -> dict:
    """name -> object of the attributes of the objects the function `code` runs on (as a method)."""
    out: dict = {}
    for _, obj in _state_sites.objects_defining(ctx, code.co_filename, code.co_firstlineno, code.co_name):
        with contextlib.suppress(TypeError):
            out.update(vars(obj))
    return out


def handed_writes(ctx, codes, attr: str, writes) -> list:
    """[(file, line, function, caller)] for the statements writing through a numpy view of the parameter that
    receives `<x>.attr` in a call made by one of `codes` (the functions that ran); `writes(func, name, bare)`
    gives a def's lines writing through a view of the name. caller: the (file, line, function) of that call."""
    out = []
    for code in codes:
        func = _state_sites.function_node(code)
        if func is None:
            continue
        held = None
        for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
            if not any(isinstance(a, ast.Attribute) and a.attr == attr for a in
                       list(call.args) + [k.value for k in call.keywords]):
                continue
            if held is None:
                held = _held(ctx, code)
            callee = handoff.resolve(code.co_filename, call.func) or handoff._held_method(call.func, held)
            target = handoff._code(callee) if callee is not None and not isinstance(callee, type) else None
            if target is None:
                continue
            param = handoff._param(target, call, attr, inspect.ismethod(callee))
            node = _state_sites.function_node(target) if param else None
            if node is None:
                continue
            out += [(target.co_filename, line, target.co_name, (code.co_filename, call.lineno, code.co_name))
                    for line in writes(node, param, True)]
    return out
