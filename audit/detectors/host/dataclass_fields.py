"""Where a dataclass's tensor field was made: read from the calls that construct the dataclass.

A quantized weight keeps its state in a dataclass (a bitsandbytes-style `QuantState(code, absmax, ...)`), whose
generated `__init__` has no source: the attribute rules, which read a class's own assignments
(`attr_memory.host_factory_attr`), find nothing there. The field's value comes from the calls of the class
in its file: a codebook made by a host factory (`code = nf4_codebook()`, a helper returning
`torch.tensor(NF4)`) and passed in lives in pageable host memory on a GPU too, and moving it to the device in
the step (`qs.code.to(x.device)`) copies from pageable memory. Every call must pass the field, each argument
made the same way (a host factory, a local assigned one, a module-level helper all of whose returns are one).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect

from audit.detectors.source import scopes
from audit.detectors.host.attr_memory import host_memory
from audit.detectors.source.lookup import tree
from audit.scan.sources.ast_nodes import all_nodes

__all__ = ["field_memory"]

_DEPTH = 2


def field_memory(obj, name: str) -> str | None:
    """"pageable" / "pinned" when every construction of `obj`'s dataclass in its file passes field `name` a
    tensor made in host memory that way, else None."""
    cls = type(obj)
    if not dataclasses.is_dataclass(cls):
        return None
    return _field_memory(cls, name)


@functools.lru_cache(maxsize=256)
def _field_memory(cls: type, name: str) -> str | None:
    init = [f.name for f in dataclasses.fields(cls) if f.init]
    try:
        file = inspect.getsourcefile(cls)
    except TypeError:
        return None
    t = tree(file) if file and name in init else None
    if t is None:
        return None
    k, kinds = init.index(name), set()
    for call in (n for n in all_nodes(t) if isinstance(n, ast.Call) and _called(n.func) == cls.__name__):
        arg = next((kw.value for kw in call.keywords if kw.arg == name), call.args[k] if k < len(call.args) else None)
        kind = _kind(file, t, arg, call.lineno, _DEPTH) if arg is not None else None
        if kind is None:
            return None
        kinds.add(kind)
    return kinds.pop() if len(kinds) == 1 else None


def _called(f) -> str | None:
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _kind(file: str, t: ast.Module, value, line: int, depth: int) -> str | None:
    """How an expression makes its tensor: a host factory (`host_memory`), a local assigned one, or a call of a
    module-level function of the file all of whose returns are one."""
    if (kind := host_memory(file, value)) is not None or depth <= 0:
        return kind
    if isinstance(value, ast.Name):
        vals = scopes.values(t, value, line)
        kinds = {_kind(file, t, v, ln, depth - 1) for v, ln in vals or ()}
        return kinds.pop() if vals and len(kinds) == 1 else None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        fn = next((n for n in t.body if isinstance(n, ast.FunctionDef) and n.name == value.func.id), None)
        rets = [r for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None] if fn else []
        kinds = {_kind(file, t, r.value, r.lineno, depth - 1) for r in rets}
        return kinds.pop() if rets and len(kinds) == 1 else None
    return None
