"""The target's line that calls an object kept in one of its containers.

Stopping criteria, logits processors and hooks (objects, or closures a library factory made) live in
an attribute of the target or in a list or dict the target holds
(`self.criteria = [MaxLength(...)]`) and are called through a loop variable
(`for c in self.criteria: c(ids)`, `any(c(ids) for c in self.criteria)`) or a subscript
(`self.criteria[0](ids)`). A counter such an object keeps changes in library code that ran no torch op;
its caller is that target line, which no search for calls on the attribute itself finds.
"""

from __future__ import annotations

import ast
import functools
import types

from audit.detectors.source.implicit import implicit_uses
from audit.detectors.source.mutations import method_calls, tree
from audit.detectors.state.sites import closure_functions
from audit.scan.snapshot.own_dict import own_dict
from audit.scan.sources.ast_nodes import nodes_of
from audit.scan.snapshot import class_state

__all__ = ["container_call", "held_names"]

_FUNC = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def container_call(ctx, owner: str, own_files, ran: set, site_fn: str, site_attr: str = ""):
    """(file, line, function) of the target's call of the element of a container attribute that `owner`
    names (`criteria.0`, `procs.temp.__self__`), or of a closure (`<closure make_proc.<locals>.proc>`) kept
    in an attribute or a container of the target, functions that ran in the step first; None when there
    is no such line."""
    obj = None
    if owner.startswith("<closure "):
        held = {id(fn) for fn in closure_functions(ctx, owner)}
        site_fn = "__call__"
    elif owner.startswith("<class "):  # an object kept on the target's class, called as `self.crit(ids)`
        obj = class_held(ctx, owner, site_attr)
        held = {id(obj)} if obj is not None else set()
    else:  # every path to the object: a bound method of it kept in a callback list, a partial of one
        obj = _reach(ctx.target, owner.split("."))
        held = {id(obj)} if obj is not None else set()
    if owner.startswith("<class "):
        paths = [[site_attr.split(".")[0]]] if held else []
    else:
        paths = [owner.split(".")] + [p for p in (_paths_to(ctx.target, held) if held else []) if p != owner.split(".")]
    # a partial kept in an attribute (`self.proc = partial(count_calls, {"n": 0})`) is called as `self.proc(h)`
    called_itself = owner.startswith(("<closure ", "<class ")) or isinstance(obj, functools.partial)
    for parts in paths:
        if len(parts) == 1 and called_itself:  # an attribute itself: `self.proc(h)`
            hits = [((f, fn) not in ran, line, f, fn) for f in sorted(own_files)
                    for line, fn in implicit_uses(f, parts[0], "__call__")]
            hits = hits or [((f, fn) not in ran, line, f, fn) for f in sorted(own_files)
                            for line, fn, _ in method_calls(f, parts[0]) if fn not in ("__init__", "prepare")]
            if hits:
                return _best(hits)
        for i in range(len(parts) - 1, 0, -1):
            if not isinstance(_reach(ctx.target, parts[:i]), (list, tuple, dict)):
                continue
            holder = _reach(ctx.target, parts[:i - 1])  # `self.layers` in a class of another object is not it
            classes = None if holder is None else {c.__name__ for c in type(holder).__mro__}
            hits = [((f, fn) not in ran, line, f, fn) for f in sorted(own_files)
                    for line, fn in element_calls(f, parts[i - 1], site_fn, classes)]
            if hits:
                return _best(hits)
    return None


def held_names(ctx, owner: str) -> set[str]:
    """The attribute names (or dict keys) under which the target's objects hold the changed callable: a
    partial, a closure, or a bound method of the changed object. A library object keeping one
    (`self.post = post`) calls it through that attribute (`tok = self.post(ids, tok)`), not by its
    function's name."""
    if owner.startswith("<closure "):
        held, itself = {id(fn) for fn in closure_functions(ctx, owner)}, True
    else:
        obj = None if owner.startswith("<") else _reach(ctx.target, owner.split("."))
        held, itself = ({id(obj)} if obj is not None else set()), isinstance(obj, functools.partial)
    names = set()
    for path in _paths_to(ctx.target, held) if held else ():
        tail = len(path)
        while tail and path[tail - 1] in ("__self__", "func"):  # a bound method of it, a partial of that
            tail -= 1
        if tail and (itself or tail < len(path)) and path[tail - 1].isidentifier():
            names.add(path[tail - 1])
    return names


def handed_call(ctx, owner: str, own_files, ran: set):
    """(file, line, function) of the target's call that hands the object held in one of its attributes to
    a library helper that calls it (`run_criterion(self.crit, ids)`); None when there is none."""
    obj = None if owner.startswith("<") else _reach(ctx.target, owner.split("."))
    paths = [owner.split(".")] + (_paths_to(ctx.target, {id(obj)}) if obj is not None else [])
    hits = [((f, fn) not in ran, line, f, fn) for parts in paths if len(parts) == 1 for f in sorted(own_files)
            for line, fn in handed_to(f, parts[0])]
    return _best(hits) if hits else None


def handed_to(filename: str, attr: str) -> list[tuple[int, str]]:
    """(line, function) of the calls in `filename` that take the object held in `<x>.attr`, or a method of it,
    as an argument (`run_criterion(self.crit, ids)`: a library helper that calls it), outside `__init__`
    and `prepare`."""
    t = tree(filename)
    out = []
    for func in nodes_of(t, _FUNC) if t is not None else ():
        name = getattr(func, "name", "<lambda>")
        if name in ("__init__", "prepare"):
            continue
        out += [(n.lineno, name) for n in ast.walk(func) if isinstance(n, ast.Call)
                and any(_passes(a, attr) for a in list(n.args) + [k.value for k in n.keywords])]
    return sorted(set(out))


def _passes(a, attr: str) -> bool:
    """`<x>.attr` or one of its methods (`self.counter.on_step`) as an argument."""
    while isinstance(a, ast.Attribute) and a.attr != attr:
        a = a.value
    return isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name)


def class_held(ctx, owner: str, attr: str):
    """The object a `<class Q>` state key's dotted attribute names (`crit` of `crit.n`): on a class of the
    target's objects first (another class of that name may be loaded in the process), else None."""
    if "." not in attr:
        return None
    head = attr.split(".")[0]
    classes = [c for _, o in ctx.trace.objects for c in type(o).__mro__] + [class_state.CLASSES.get(owner)]
    for cls in classes:
        if cls is not None and f"<class {cls.__qualname__}>" == owner and head in vars(cls):
            return vars(cls)[head]
    return None


def _best(hits):
    _, line, f, fn = min(hits)
    return (f, line, fn)


def _paths_to(root, ids: set, depth: int = 3) -> list[list[str]]:
    """The paths (attribute names, list indices, dict keys) from the target to the objects in `ids`."""
    out, seen = [], set()

    def walk(obj, path):
        if id(obj) in ids:
            out.append(path)
            return
        if len(path) >= depth or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, types.MethodType):
            items = [("__self__", obj.__self__)]
        elif isinstance(obj, functools.partial):
            items = [("func", obj.func)]
        elif isinstance(obj, (list, tuple)):
            items = [(str(k), v) for k, v in enumerate(obj)]
        elif isinstance(obj, dict):
            items = [(str(k), v) for k, v in obj.items()]
        else:
            items = list(own_dict(obj).items()) if not isinstance(obj, type) else []
        for k, v in items:
            walk(v, path + [k])

    walk(root, [])
    return out


def _reach(obj, parts):
    """The object at `parts` from the target (attributes, list indices, dict keys), else None."""
    for p in parts:
        if isinstance(obj, (list, tuple)) and p.lstrip("-").isdigit() and -len(obj) <= int(p) < len(obj):
            obj = obj[int(p)]
        elif isinstance(obj, dict) and p in obj:
            obj = obj[p]
        elif isinstance(obj, dict) and p.lstrip("-").isdigit() and int(p) in obj:
            obj = obj[int(p)]
        else:
            try:
                obj = getattr(obj, p)
            except Exception:  # a property that raises, a name the snapshot made up
                return None
    return obj


def _holds(n, attr: str) -> bool:
    """`<x>.attr` (`self.gen.criteria` too), or a view of it that yields its elements (`.values()`,
    `enumerate(...)`, `reversed(...)`)."""
    if isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.value, (ast.Name, ast.Attribute)):
        return True
    if isinstance(n, ast.Call):
        if isinstance(n.func, ast.Attribute) and n.func.attr in ("values", "items") and not n.args:
            return _holds(n.func.value, attr)
        if isinstance(n.func, ast.Name) and n.func.id in ("enumerate", "reversed", "list", "tuple") and n.args:
            return _holds(n.args[0], attr)
    return False


def _method_classes(t) -> dict:
    """id(function node) -> the name of the class whose body (or a method's body) holds it."""
    out = {}
    for cls in nodes_of(t, (ast.ClassDef,)):  # outer classes first: a nested class's methods end up its own
        out.update({id(f): cls.name for f in ast.walk(cls) if isinstance(f, _FUNC)})
    return out


def _self_attr(n) -> bool:
    """`self.attr`, or a view of it (`enumerate(self.attr)`, `self.attr.values()`)."""
    while isinstance(n, ast.Call):
        n = n.args[0] if isinstance(n.func, ast.Name) and n.args else getattr(n.func, "value", None)
    return isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"


def _names(target) -> set:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def element_calls(filename: str, attr: str, site_fn: str, classes=None) -> list[tuple[int, str]]:
    """(line, function) of the calls in `filename` on an element of the container held in `<x>.attr`:
    through a loop or comprehension variable over it, a lambda handed it with the container (`map`,
    `functools.reduce`), or a subscript of it; `site_fn` is the element's
    method that ran (`__call__`: the element called itself; another name: that method called on it), or,
    when no line makes that call, any call on an element (a method that calls the site's).
    `classes`: the class names of the object holding the container, when known: `self.attr` in a method of
    another class is another object's container (the target's `self.layers` of modules is not the
    `layers` list inside a library cache the target keeps, `self.cache.layers`)."""
    t = tree(filename)
    if t is None:
        return []
    owners = _method_classes(t)
    out = []
    for func in nodes_of(t, _FUNC):
        other = classes is not None and owners.get(id(func)) not in (None, *classes)

        def holds(n) -> bool:
            return _holds(n, attr) and not (other and _self_attr(n))

        loop = set()
        for n in ast.walk(func):
            if isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)) and holds(n.iter):
                loop |= _names(n.target)
            elif isinstance(n, ast.Call) and any(holds(a) for a in n.args):  # map(lambda c: c(ids), self.crits)
                loop |= {p.arg for a in n.args if isinstance(a, ast.Lambda) for p in a.args.args}

        def element(n) -> bool:
            return (isinstance(n, ast.Name) and n.id in loop) or \
                (isinstance(n, ast.Subscript) and holds(n.value))

        name = getattr(func, "name", "<lambda>")
        for n in ast.walk(func):
            if not isinstance(n, ast.Call):
                continue
            if element(n.func):
                out.append((site_fn != "__call__", n.lineno, name))
            elif isinstance(n.func, ast.Attribute) and element(n.func.value):
                out.append((n.func.attr != site_fn, n.lineno, name))
    best = min((o[0] for o in out), default=False)
    return sorted({(line, name) for other, line, name in out if other == best})
