"""Tensors a class sends to host memory in its source, kept in an attribute or in a container attribute.

An offload helper (accelerate-style) keeps a module's weights on the host, `{n: p.detach().to("cpu") ...}`,
and moves them to the execution device at every forward: on a GPU that is a copy from pageable memory,
which capture refuses. On a CPU scan `.to("cpu")` and the later `.to(device)` copy nothing, so only the
source says the tensors live on the host: every assignment of the attribute ends in `.cpu()` or
`.to(<the CPU>)` (a comprehension or literal of such moves, for a dict or list), also through a helper of the
file returning them and the constructor parameter they are passed as (accelerate's weights map:
`OffloadedWeightsLoader(offload_state_dict(module))` keeping `self.state_dict = state_dict`). `.pin_memory()`
after the move is pinned staging, not this.
"""

from __future__ import annotations

import ast

import torch

from audit.detectors.source import scopes
from audit.detectors.host.kept import class_spans
from audit.detectors.source.lookup import tree
from audit.scan.snapshot.own_dict import own_dict
from audit.scan.sources.ast_nodes import all_nodes


def members(ctx):
    """(storage id, 'owner.attr[key]', attribute name, owner, tensor) for each CPU tensor held in a dict, list
    or tuple attribute of the objects reachable from the target."""
    from audit.scan.snapshot import state

    for path, obj in ctx.trace.objects:
        for name, v in list(own_dict(obj).items()):
            for key, t in _nested(v):
                if t.device.type == "cpu":
                    yield state.storage_id(t), f"{path}.{name}{key}" if path else f"{name}{key}", name, obj, t


def _nested(v, depth: int = 3, key: str = ""):
    """('[k]...', tensor) for the tensors a dict, list or tuple holds, also in nested ones (a collated batch
    `{"input_ids": ..., "extra": {"position_ids": ...}}`), a few levels deep."""
    if isinstance(v, dict) and len(v) <= 4096:
        items = list(v.items())
    elif isinstance(v, (list, tuple)) and len(v) <= 4096:
        items = list(enumerate(v))
    else:
        return
    for k, t in items:
        if isinstance(t, torch.Tensor):
            yield f"{key}[{k!r}]", t
        elif depth > 1:
            yield from _nested(t, depth - 1, f"{key}[{k!r}]")


def moved_to_host(filename: str, attr: str, lines: tuple[int, int] | None = None, test=None) -> bool:
    """Whether every assignment of `<x>.attr` in the source (or a span of it) is a tensor sent to the CPU:
    `t.cpu()`, `t.detach().to("cpu")`, or a dict / list of such (a comprehension or a literal), made there or
    passed in (`_host_value`). A container filled member by member counts by its members: an empty literal
    (`self.snaps = {}`) says nothing, and each store into it (`self.snaps[k] = state.cpu()`) must be such a
    move. `test`: another check of the values (`device_value`: made on a device)."""
    t = tree(filename)
    seen = False
    for node in all_nodes(t) if t is not None else ():
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None \
                or (lines and not lines[0] <= node.lineno <= lines[1]):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        member = any(isinstance(x, ast.Subscript) and isinstance(x.value, ast.Attribute) and x.value.attr == attr
                     for x in targets)
        if not member and not any(isinstance(x, ast.Attribute) and x.attr == attr for x in targets):
            continue
        if not member and isinstance(node.value, (ast.Dict, ast.List)) and not _elements_of(node.value):
            continue  # `self.snaps = {}`: filled member by member
        value = _elements(node.value) if member else [node.value]
        if not all((test or _host_value)(t, v, node.lineno, 2) for v in value):
            return False
        seen = True
    return seen


def host_made(filename: str):
    """A `moved_to_host` test: a value made of tensors torch factories make in pageable host memory, naming no
    device (`{"ids": torch.zeros(b, dtype=torch.long), "extra": {"scale": torch.ones(b)}}`), nested literals
    included."""
    from audit.detectors.host.attr_memory import host_memory

    def test(t, value, line, depth):
        vals = _elements(value)
        return all(v is not None and (test(t, v, line, depth) if isinstance(v, (ast.Dict, ast.List, ast.Tuple))
                                      else host_memory(filename, v) == "pageable") for v in vals)
    return test


def _elements_of(literal) -> list:
    return literal.values if isinstance(literal, ast.Dict) else literal.elts


def device_value(t: ast.Module, value, line: int, depth: int = 0) -> bool:
    """A value made of tensors made on a device: `torch.zeros(n, device=device)` (not the CPU), `.to(D)`,
    `.cuda()`, or a dict / list of such (a comprehension or a literal)."""
    for v in _elements(value):
        while isinstance(v, ast.BinOp):  # `torch.randn(n, device=device) * 0.1`
            v = v.left
        if not isinstance(v, ast.Call) or not isinstance(v.func, (ast.Attribute, ast.Name)):
            return False
        named = [k.value for k in v.keywords if k.arg == "device"]
        if getattr(v.func, "attr", "") == "to" and v.args and not named:
            named = [v.args[0]]
        if getattr(v.func, "attr", "") != "cuda" and not (named and not scopes.names_cpu(t, named[0], v.lineno)):
            return False
    return True


def device_members(ctx) -> set:
    """Storage ids of the tensors held in dict or list attributes that their class makes on a device
    (`self.states = {i: torch.zeros(n, d, device=device) for i in ids}`): device tensors on a GPU."""
    return {sid for sid, _, name, obj, _ in members(ctx)
            if any(moved_to_host(f, name, span, test=device_value) for f, span in class_spans(type(obj)))}


def _host_value(t: ast.Module, value, line: int, depth: int) -> bool:
    """A value made of tensors sent to the CPU: moves themselves, the result of a function of this file all of
    whose returns are (`offload_state_dict(module)`), or the `__init__` parameter it was passed as, when
    every call of the class in this file passes one (`OffloadedWeightsLoader(offload_state_dict(m))`)."""
    if all(_to_cpu(t, v) for v in _elements(value)):
        return True
    if depth <= 0:
        return False
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        fn = _defs(t, ast.FunctionDef).get(value.func.id)
        rets = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None] if fn else []
        return bool(rets) and all(_host_value(t, r, r.lineno, depth - 1) for r in rets)
    if isinstance(value, ast.Name):
        cls = next((c for c in _defs(t, ast.ClassDef).values() if c.lineno <= line <= c.end_lineno), None)
        init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None) if cls else None
        params = [a.arg for a in init.args.args[1:]] if init else []
        if value.id not in params:
            return False
        k = params.index(value.id)
        args = [next((kw.value for kw in c.keywords if kw.arg == value.id), c.args[k] if k < len(c.args) else None)
                for c in all_nodes(t) if isinstance(c, ast.Call) and getattr(c.func, "id", None) == cls.name]
        return bool(args) and all(a is not None and _host_value(t, a, a.lineno, depth - 1) for a in args)
    return False


def _defs(t: ast.Module, kind) -> dict:
    """The module-level functions or classes of a file, by name."""
    return {n.name: n for n in t.body if isinstance(n, kind)}


def _elements(value) -> list:
    """The tensor expressions an assigned value holds: a comprehension's element, a literal's items."""
    if isinstance(value, ast.DictComp):
        return [value.value]
    if isinstance(value, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        return [value.elt]
    if isinstance(value, ast.Dict):
        return list(value.values) or [None]
    if isinstance(value, (ast.List, ast.Tuple)):
        return list(value.elts) or [None]
    return [value]


def _to_cpu(t: ast.Module, n) -> bool:
    """`x.cpu()` or `x.to(<the CPU>)` / `x.to(device=<the CPU>)` as the outermost call."""
    if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Attribute):
        return False
    if n.func.attr == "cpu":
        return True
    if n.func.attr != "to":
        return False
    dev = n.args[0] if n.args else next((k.value for k in n.keywords if k.arg == "device"), None)
    return dev is not None and scopes.names_cpu(t, dev, n.lineno)
