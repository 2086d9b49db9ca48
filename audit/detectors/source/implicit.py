"""The target's lines that run a dunder method of an object by syntax alone.

A library wrapper's `__getattr__` that counts look-ups runs on `self.mlp.scale`, its `__call__` (or a
module's `forward`) on `self.mlp(h)`, its `__getitem__` on `self.table[k]`: no call names the method, so a search for
method calls finds none of them. These are the lines where the object held in `<x>.holder` (or a
local alias of it) meets the syntax that invokes the dunder.
"""

from __future__ import annotations

import ast

from audit.detectors.state import handoff
from audit.detectors.source.mutations import tree
from audit.scan.sources.ast_nodes import all_nodes, nodes_of
from audit.scan.sources.user_code import OWN

_FUNC = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _uses(node, is_obj, dunder: str) -> bool:
    """Whether `node` invokes `dunder` on an object `is_obj` accepts (`.name` / `.name=`: a property's getter / setter,
    see syntax_of)."""
    if dunder.startswith("."):
        want = ast.Store if dunder.endswith("=") else ast.Load
        return isinstance(node, ast.Attribute) and node.attr == dunder[1:].rstrip("=") and isinstance(node.ctx, want) \
            and is_obj(node.value)
    if dunder in ("__getattr__", "__getattribute__", "__setattr__", "__delattr__"):
        want = {"__setattr__": ast.Store, "__delattr__": ast.Del}.get(dunder, ast.Load)
        return isinstance(node, ast.Attribute) and isinstance(node.ctx, want) and is_obj(node.value)
    if dunder in ("__getitem__", "__setitem__", "__delitem__"):
        want = {"__setitem__": ast.Store, "__delitem__": ast.Del}.get(dunder, ast.Load)
        return isinstance(node, ast.Subscript) and isinstance(node.ctx, want) and is_obj(node.value)
    if dunder in ("__call__", "forward"):  # calling a module runs its forward (a scripted one: no frame)
        return isinstance(node, ast.Call) and is_obj(node.func)
    if dunder in ("__enter__", "__exit__"):
        return isinstance(node, (ast.With, ast.AsyncWith)) and any(is_obj(i.context_expr) for i in node.items)
    if dunder in ("__iter__", "__next__"):
        return isinstance(node, (ast.For, ast.comprehension)) and is_obj(node.iter)
    if dunder == "__len__":
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" \
            and len(node.args) == 1 and is_obj(node.args[0])
    if dunder == "__contains__":
        return isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) and is_obj(c)
                                                     for o, c in zip(node.ops, node.comparators))
    return False


DUNDERS = frozenset({"__getattr__", "__getattribute__", "__setattr__", "__delattr__", "__getitem__",
                     "__setitem__", "__delitem__", "__call__", "forward", "__enter__", "__exit__", "__iter__",
                     "__next__", "__len__", "__contains__"})


def implicit_uses(filename: str, holder: str, dunder: str, global_name: bool = False) -> list[tuple[int, str]]:
    """(line, function) of the statements of `filename` that invoke `dunder` on the object held in
    `<x>.holder` (the global `holder`), or on a local alias of it (`mlp = self.mlp`)."""
    t = tree(filename)
    if t is None or (dunder not in DUNDERS and not dunder.startswith(".")):
        return []

    def direct(n) -> bool:
        if global_name:
            return isinstance(n, ast.Name) and n.id == holder
        return isinstance(n, ast.Attribute) and n.attr == holder and isinstance(n.value, ast.Name)

    out = []
    for func in nodes_of(t, _FUNC):
        aliases = {x.id for n in ast.walk(func) if isinstance(n, ast.Assign) and direct(n.value)
                   for x in n.targets if isinstance(x, ast.Name)}

        def is_obj(n) -> bool:
            return direct(n) or (isinstance(n, ast.Name) and n.id in aliases)

        name = getattr(func, "name", "<lambda>")
        out += [(n.lineno if hasattr(n, "lineno") else n.iter.lineno, name)
                for n in ast.walk(func) if _uses(n, is_obj, dunder)]
    return sorted(set(out))


def syntax_of(site) -> str:
    """What runs the function of a site (file, line, name) by syntax: its name (a dunder: `__len__` by `len(x)`), or,
    for a property's getter, `.name` (run by reading `x.name`, an attribute access that no call names: a block table's
    `next_slot` property advancing a host cursor) and `.name=` for its setter (run by `x.name = v`)."""
    file, line, fn = site
    t = tree(file) if file else None
    defs = [n for n in all_nodes(t) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == fn
            and n.lineno <= line <= (n.end_lineno or n.lineno)] if t is not None else []
    for d in (max(defs, key=lambda n: n.lineno).decorator_list if defs else ()):
        text = ast.unparse(d)
        if text in ("property", "functools.cached_property", "cached_property"):
            return "." + fn
        if text.endswith(".setter"):
            return "." + fn + "="
    return fn


def accessor_sites(ctx, sites: list) -> list:
    """Of sites (file, line, function) in a class's methods, drop those in a property accessor whose syntax the
    target's own code never writes while it writes the other: reading `x.name` runs the getter, `x.name = v` the
    setter, and both are named `name` (a cursor property whose setter writes the same cursor); the rest are kept,
    and all when none is left."""
    own = {ent[0].co_filename for ent in ctx.trace.codes.values() if ent[1] == OWN}
    written = {(n.attr, type(n.ctx)) for f in own for n in ast.walk(tree(f) or ast.Module(body=[], type_ignores=[]))
               if isinstance(n, ast.Attribute)}

    def runs(site) -> bool:  # a name the target never writes is read by the library: no say
        kind = syntax_of(site)
        return not kind.startswith(".") or not {(site[2], ast.Load), (site[2], ast.Store)} & written \
            or (site[2], ast.Store if kind.endswith("=") else ast.Load) in written

    return [s for s in sites if runs(s)] or sites


def inline_uses(own_files, site, ran: set) -> tuple[str, int, str] | None:
    """For a site in a dunder of a library class the target makes inline (`with fp8_autocast():` runs its
    `__enter__` and `__exit__`): the target's line with that syntax on a call of the class, functions
    that ran in the step first; None when there is none."""
    file, _, dunder = site
    if dunder not in DUNDERS:
        return None
    hits = []
    for f in sorted(own_files):
        t = tree(f)
        for func in nodes_of(t, _FUNC) if t is not None else ():
            def is_obj(n, f=f) -> bool:
                return isinstance(n, ast.Call) and _defines(handoff.resolve(f, n.func), dunder, file)

            name = getattr(func, "name", "<lambda>")
            hits += [((f, name) not in ran, n.lineno if hasattr(n, "lineno") else n.iter.lineno, f, name)
                     for n in ast.walk(func) if _uses(n, is_obj, dunder)]
    if not hits:
        return None
    _, line, f, name = min(hits)
    return (f, line, name)


def _defines(obj, dunder: str, file: str) -> bool:
    """Whether `obj` is a class whose `dunder` is written in `file`."""
    code = getattr(getattr(obj, dunder, None), "__code__", None) if isinstance(obj, type) else None
    return code is not None and code.co_filename == file


def class_call(cls, site, own_files, ran: set) -> tuple[str, int, str] | None:
    """For a site in a metaclass's `__call__` (counting instances on the class): the target's line that
    instantiates the class (`proc = MinP(0.05)` runs it, not `proc(logits)`), functions that ran in the step
    first; None when the site is not in the class's metaclass, or there is no such line."""
    file, _, fn = site
    meta = type(cls) if isinstance(cls, type) else None
    if meta is None or meta is type or fn != "__call__" or not _defines(meta, fn, file):
        return None
    hits = []
    for f in sorted(own_files):
        t = tree(f)
        for func in nodes_of(t, _FUNC) if t is not None else ():
            name = getattr(func, "name", "<lambda>")
            hits += [((f, name) not in ran, n.lineno, f, name) for n in ast.walk(func) if isinstance(n, ast.Call)
                     and getattr(n.func, "id", getattr(n.func, "attr", None)) == cls.__name__
                     and handoff.resolve(f, n.func) is cls]
    if not hits:
        return None
    _, line, f, name = min(hits)
    return (f, line, name)
