"""A counter that reaches a branch as a parameter: the caller passes it, the callee tests it.

`self.rope(h, self.seq_len)` with `prepare()` staging `self.seq_len = i + 1`, and in the rotary module
`if seq_len > self.max_seq_len_cached: self._set_cache(seq_len)` (transformers' legacy rotary embedding): the
callee's test reads no counter of its own object, only a parameter, yet the value is the caller's counter and the
test turns on a later step (the cache would be rebuilt there, and a graph replays the captured side forever).
For a function the steps ran, each parameter it never rebinds is followed to the traced call that ran it: the
frame just above it on the records' stacks, the call on that line naming the function (or the module whose
`forward` it is, when only one call there could be), and the argument in the parameter's place. When that
argument is a counter of the caller (read the way counter_branches reads its own: `self.attr` of the objects the
caller runs on, a module global) with constants and arithmetic, the parameter is bound to it.
"""

from __future__ import annotations

import ast

from audit.scan.sources.ast_nodes import nodes_of
from audit.scan.sources.frame_source import function_of


def callers(ctx) -> dict:
    """id(code) -> the distinct (code, line) frames right above it on the stacks of the complete steps' records
    (one pass over the trace, keyed by ids: hashing a code object hashes its bytecode)."""
    out: dict = {}
    for s in ctx.complete:
        last = None
        for r in ctx.steps[s]:
            if r.stack is last:
                continue
            last = r.stack
            for (c0, l0), (c1, _) in zip(r.stack, r.stack[1:]):
                out.setdefault(id(c1), {}).setdefault((id(c0), l0), (c0, l0))
    return {k: list(v.values()) for k, v in out.items()}


def _call_on(func, line: int, callee) -> ast.Call | None:
    """The one call on `line` of `func` that runs `callee` (a def node): named after it, or, for a module's
    `forward` / `__call__` (reached through the module's own call), the only call there whose arguments fit its
    parameters (`self.out.copy_(self.rope(x, n))`: `copy_` passes one argument, the rotary's forward takes two)."""
    calls = [c for c in nodes_of(func, ast.Call) if c.lineno <= line <= (c.end_lineno or c.lineno)]
    named = [c for c in calls if (c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", None))
             == callee.name]
    if len(named) == 1:
        return named[0]
    fit = [c for c in calls if _fits(c, callee)] if not named and callee.name in ("forward", "__call__") else []
    return fit[0] if len(fit) == 1 else None


def _fits(call: ast.Call, func) -> bool:
    """The call passes every parameter of the method `func` that has no default, and none it lacks."""
    a = func.args
    params = [x.arg for x in a.posonlyargs + a.args][1:]
    if any(isinstance(x, ast.Starred) for x in call.args) or any(k.arg is None for k in call.keywords):
        return False
    if len(call.args) > len(params) and a.vararg is None:
        return False
    names = params + [x.arg for x in a.kwonlyargs]
    if any(k.arg not in names for k in call.keywords) and a.kwarg is None:
        return False
    given = set(params[:len(call.args)]) | {k.arg for k in call.keywords}
    required = params[:len(params) - len(a.defaults)] + [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    return all(r in given for r in required)


def _argument(call: ast.Call, func, param: str) -> ast.AST | None:
    """The argument `call` passes for parameter `param` of `func` (a method called bound: its first parameter
    is the object)."""
    params = [a.arg for a in func.args.posonlyargs + func.args.args]
    for k in call.keywords:
        if k.arg == param:
            return k.value
    if param not in params or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    i = params.index(param) - (1 if params and params[0] in ("self", "cls") else 0)
    return call.args[i] if 0 <= i < len(call.args) else None


def _plain(e, refs) -> bool:
    """The argument reads a counter, and otherwise only constants and arithmetic over them."""
    def ok(n) -> bool:
        if id(n) in refs:
            return True
        if isinstance(n, ast.Constant):
            return True
        if isinstance(n, (ast.BinOp, ast.UnaryOp)):
            return all(ok(c) for c in ast.iter_child_nodes(n) if not isinstance(c, (ast.operator, ast.unaryop)))
        return False
    return ok(e) and any(id(n) in refs for n in ast.walk(e))


def passed(above: dict, code, func, refs_of) -> tuple[dict, dict]:
    """(refs, bound) for the parameters of `func` bound to a caller's counter: refs maps the caller's nodes that
    read a counter to it, bound a parameter's name to the argument expression. `above` is callers(ctx);
    `refs_of(code, func)` reads the counter refs of a function the way counter_branches does."""
    args = func.args.posonlyargs + func.args.args + func.args.kwonlyargs
    rebound = {m.id for n in nodes_of(func, (ast.Assign, ast.AugAssign, ast.AnnAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) for m in ast.walk(t)
               if isinstance(m, ast.Name)}
    params = [a.arg for a in args if a.arg not in rebound and a.arg not in ("self", "cls")]
    if not params:
        return {}, {}
    refs, bound = {}, {}
    for caller, line in above.get(id(code), ()):
        cfunc = function_of(caller)
        call = _call_on(cfunc, line, func) if cfunc is not None else None
        if call is None:
            continue
        crefs = refs_of(caller, cfunc)
        for p in params:
            a = _argument(call, func, p)
            if a is not None and crefs and _plain(a, crefs) and p not in bound:
                bound[p] = a
                refs.update((id(n), crefs[id(n)]) for n in ast.walk(a) if id(n) in crefs)
    return refs, bound
