"""The target's objects handed to library code: a call in the target's source that passes one of its
attributes (`SectionTimer(self.times, "mlp")`), resolved at run time to the library's function or class.

The library then changes the object under its own name (`self.store.setdefault(k, []).append(t)` in the
timer's `__exit__`), which no lookup by the target's attribute name can find; the parameter it arrived
in, and the attributes the class keeps it in, can.
"""

from __future__ import annotations

import ast
import contextlib
import inspect

from audit.detectors.source import mutations
from audit.detectors.source.lookup import tree
from audit.scan.sources.ast_nodes import all_nodes, nodes_of
from audit.scan.sources import loaded


def resolve(filename: str, func: ast.expr):
    """What the callee `f`, `mod.f` or a longer dotted name (`mod.Store.put`, a classmethod called through
    its class; `pkg.mod.f`) of a call in `filename` is bound to in that module's globals (None when it is no
    such form, or the module is not loaded)."""
    chain, v = [], func
    while isinstance(v, ast.Attribute):
        chain.insert(0, v.attr)
        v = v.value
    chain = [v.id] + chain if isinstance(v, ast.Name) else None
    mod = loaded.module_in(filename)
    if not chain or mod is None:
        return None
    obj = mod
    for name in chain:
        obj = getattr(obj, name, None)
    return obj


def _code(obj):
    """The code object of a function, or of a class's `__init__` (unwrapped), else None."""
    fn = obj.__init__ if isinstance(obj, type) else obj
    with contextlib.suppress(Exception):
        return inspect.unwrap(fn).__code__
    return None


def _param(code, call: ast.Call, attr: str, is_class: bool) -> str | None:
    """The parameter of `code` that receives the argument rooted at `<x>.attr` in `call`."""
    names = list(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
    if is_class and names:
        names = names[1:]  # self
    for i, a in enumerate(call.args):
        if i < len(names) and mutations._rooted(a, attr) and mutations._same_object(a):
            return names[i]
    return next((k.arg for k in call.keywords if k.arg in names and mutations._rooted(k.value, attr)
                 and mutations._same_object(k.value)), None)


def _kept_as(cls: type, param: str) -> list[str]:
    """The attributes a class's `__init__` stores a parameter in (`self.store = store`,
    `self.store, self.name = store, name`)."""
    with contextlib.suppress(OSError, TypeError, SyntaxError):
        init = ast.parse(inspect.cleandoc("\n" + inspect.getsource(inspect.unwrap(cls.__init__))))
        return [t.attr for n in ast.walk(init) if isinstance(n, ast.Assign) for x in n.targets
                for t, v in _pairs(x, n.value) if isinstance(t, ast.Attribute) and isinstance(v, ast.Name)
                and v.id == param]
    return []


def _pairs(target, value):
    """(target, value) pairs of an assignment, tuples unpacked element by element."""
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        return [p for t, v in zip(target.elts, value.elts) for p in _pairs(t, v)]
    return [(target, value)]


def _span(obj) -> tuple[str, tuple[int, int]] | None:
    with contextlib.suppress(OSError, TypeError):
        lines, start = inspect.getsourcelines(obj)
        return inspect.getsourcefile(obj), (start, start + len(lines))
    return None


def _rebinds_local(file: str, line: int, name: str) -> bool:
    """The statement on `line` only binds the parameter `name` to another object (`kw = {**kw, "n": 1}`): the
    object the caller handed over is left as it was."""
    t = tree(file)
    return any(isinstance(n, (ast.Assign, ast.AnnAssign)) and n.lineno <= line <= (n.end_lineno or n.lineno)
               and all(isinstance(x, ast.Name) and x.id == name
                       for x in (n.targets if isinstance(n, ast.Assign) else [n.target]))
               for n in all_nodes(t)) if t is not None else False


def _held_method(func: ast.expr, held: dict):
    """`self.<a>.<method>` where `<a>` is one of the target's attributes (`held`: name -> object): the bound
    method of that object (a generation mixin's `self.model.update_model_kwargs(self.kw, t)`), else None."""
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)
            and isinstance(func.value.value, ast.Name) and func.value.value.id == "self" and func.value.attr in held):
        return None
    with contextlib.suppress(Exception):
        m = getattr(held[func.value.attr], func.attr)
        return m if inspect.ismethod(m) else None
    return None


def handoff_sites(own_files, attr: str, skip=("__init__", "prepare"), held=None) -> list[tuple[str, int, str, tuple]]:
    """(file, line, function, call) for each statement of library code that mutates an object the
    target's code hands it from `<x>.attr`: in the function it is passed to (under the parameter's
    name), or in the class it is passed to (under the attributes `__init__` keeps it in), or in the method of
    an object the target holds (`held`: its attribute name -> object). `call` is the target's (file, line,
    function) of the call that handed it over."""
    out = []
    for f in sorted(own_files):
        t = tree(f)
        for func in nodes_of(t, (ast.FunctionDef, ast.AsyncFunctionDef)) if t else ():
            if func.name in skip:
                continue
            for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
                callee = resolve(f, call.func) or _held_method(call.func, held or {})
                code = _code(callee) if callee is not None else None
                if code is None or code.co_filename in own_files:
                    continue
                param = _param(code, call, attr, isinstance(callee, type) or inspect.ismethod(callee))
                where = _span(callee) if param else None
                if where is None:
                    continue
                file, span = where
                names = [(a, False) for a in _kept_as(callee, param)] if isinstance(callee, type) else [(param, True)]
                for name, bare in names:
                    out += [(file, line, fn, (f, call.lineno, func.name))
                            for line, fn in mutations.mutation_sites(file, name, span, global_name=bare)
                            if fn != "__init__" and not (bare and _rebinds_local(file, line, name))]
    return out


def handed_over(ctx, change, ran: set) -> list:
    """(file, line, function, call) of library statements that change the target's object after the
    target's code handed it over (`SectionTimer(self.times, "mlp")`, then `self.store[...]` in the
    timer; `self.model.update(self.kw)`, then `kw["n"] += 1` in that method): calls in the target's functions
    that ran in the step (`ran`: (file, function)) come first, at most three sites."""
    held = {p: o for p, o in ctx.trace.objects if p and "." not in p}  # the target's attributes: their methods
    hits = handoff_sites({f for f, _ in ran}, change.attr.split(".")[0].split("[")[0], held=held)
    hits.sort(key=lambda h: ((h[3][0], h[3][2]) not in ran, h[3][1], h[1]))
    return list(dict.fromkeys(hits))[:3]
