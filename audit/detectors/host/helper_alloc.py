"""Host buffers a class allocates through a helper of its own file, the device passed in by the call.

A serving engine allocates its GPU cache and its CPU swap cache with one helper (vLLM's CacheEngine:
`self.gpu_cache = self._allocate_kv_cache(n_gpu, device)`, `self.cpu_cache = self._allocate_kv_cache(n_cpu, "cpu")`,
the helper returning `[torch.zeros(shape, pin_memory=pin, device=device) for _ in layers]`). No factory call
names the CPU, so the attribute rules that read a factory at the assignment see nothing; the call binding
`device` to "cpu" says where the tensors live. A swap-in that copies a block of that cache into the GPU cache
is a copy from pageable memory on a GPU, a swap-out into it a device->host copy that waits; a CPU scan sees
neither, since every tensor is on the CPU there. Whether the run asked for pinned memory is the storage's own
record (audit/scan/standins/pinned.py), not the source's.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect

from audit.detectors.state import handoff
from audit.detectors.host import places
from audit.detectors.source import scopes
from audit.detectors.source.lookup import HOST_FACTORIES, tree
from audit.scan.sources.ast_nodes import all_nodes


def _imported(filename: str, func: ast.Name):
    """The definition of the function a name of this module is bound to in another file (`from .alloc import
    allocate_blocks`), found by its code's first line, and that file; (None, None) when there is none."""
    code = None
    with contextlib.suppress(Exception):  # a callable of any kind: only a function has a definition to read
        code = inspect.unwrap(handoff.resolve(filename, func)).__code__
    t = tree(code.co_filename) if code is not None and code.co_filename != filename else None
    defs = [n for n in all_nodes(t) if isinstance(n, ast.FunctionDef) and n.name == code.co_name and code.co_firstlineno
            in [n.lineno] + [d.lineno for d in n.decorator_list]] if t is not None else []
    return (defs[0], code.co_filename) if len(defs) == 1 else (None, None)


def _helper(filename: str, t: ast.Module, call: ast.Call):
    """The function a call names (`alloc(...)`, `self._alloc(...)`, a static or class method of this file, or a
    function imported from another), whether its first parameter is bound already (a method through `self`, a
    classmethod), and the other file it is written in (None: this one); (None, False, None) when there is none."""
    if isinstance(call.func, ast.Name):
        name = call.func.id
    elif isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
        name = call.func.attr  # `self._alloc(...)`, `cls._alloc(...)`, `Engine._alloc(...)`
    else:
        return None, False, None
    defs = [n for n in all_nodes(t) if isinstance(n, ast.FunctionDef) and n.name == name]
    if not defs and isinstance(call.func, ast.Name):  # imported from another module of the library
        fn, other = _imported(filename, call.func)
        return fn, False, other
    if len(defs) != 1:
        return None, False, None
    static = any(ast.unparse(d) == "staticmethod" for d in defs[0].decorator_list)
    through = isinstance(call.func, ast.Attribute) and (call.func.value.id in ("self", "cls") or any(
        ast.unparse(d) == "classmethod" for d in defs[0].decorator_list))
    return defs[0], through and not static, None


def _bindings(fn: ast.FunctionDef, call: ast.Call, bound: bool) -> dict:
    """Parameter name -> the expression the call passes for it (or its default)."""
    names = [a.arg for a in fn.args.args]
    out = dict(zip(names[len(names) - len(fn.args.defaults):], fn.args.defaults))
    out.update(zip(names[1 if bound else 0:], call.args))
    out.update({k.arg: k.value for k in call.keywords if k.arg})
    return out


def _elements(v) -> list:
    if isinstance(v, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        return [v.elt]
    if isinstance(v, ast.DictComp):
        return [v.value]
    if isinstance(v, (ast.List, ast.Tuple)):
        return list(v.elts)
    if isinstance(v, ast.Dict):
        return list(v.values)
    return [v]


def _where(t: ast.Module, binds: dict, v, callee: str | None = None) -> str | None:
    """"host" / "device" for a `torch.<factory>(...)` whose `device=` names the CPU / another device, written there
    or bound to a parameter the call passes; None for anything else (one naming no device follows the caller's
    default device)."""
    if not (isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and isinstance(v.func.value, ast.Name)
            and v.func.value.id == "torch" and v.func.attr in HOST_FACTORIES):
        return None
    dev, line = next((k.value for k in v.keywords if k.arg == "device"), None), v.lineno
    if isinstance(dev, ast.Name) and dev.id in binds:
        dev, line = binds[dev.id], getattr(binds[dev.id], "lineno", line)  # written by the call, in `t`
    elif callee is not None:  # written in the helper's own file
        t = tree(callee) or t
    if dev is None:
        return None
    if scopes.cpu_literal(dev) or scopes.names_cpu(t, dev, line):
        return "host"
    return "device" if places._device_expr(dev) else None


@functools.lru_cache(maxsize=1024)
def allocated(filename: str, attr: str, lines: tuple[int, int] | None = None) -> str | None:
    """"host" / "device" when every assignment of `<x>.attr` in the source (or a span of it) is a call of a helper
    (or a list of such calls) every return of which makes tensors there (a factory, or a list, tuple or dict of
    factories) for the device the call passes (`self._allocate_kv_cache(n, "cpu")`); else None."""
    t = tree(filename)
    kinds = set()
    for node in all_nodes(t) if t is not None else ():
        if not isinstance(node, ast.Assign) or (lines and not lines[0] <= node.lineno <= lines[1]) \
                or not any(isinstance(x, ast.Attribute) and x.attr == attr for x in node.targets):
            continue
        for call in _elements(node.value):  # the helper's result, or a list of its results (one per layer)
            fn, bound, other = _helper(filename, t, call) if isinstance(call, ast.Call) else (None, 0, None)
            if fn is None:
                return None
            binds = _bindings(fn, call, bound)
            rets = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None]
            kinds |= {_where(t, binds, e, other) for r in rets for e in _elements(r)} if rets else {None}
    return kinds.pop() if len(kinds) == 1 else None


def _found(ctx):
    from audit.detectors.host.kept import class_spans, cpu_attrs
    from audit.detectors.host.sends import members

    for sid, label, name, obj, t in list(cpu_attrs(ctx)) + list(members(ctx)):
        yield sid, label, t, {allocated(f, name, span) for f, span in class_spans(type(obj))}


def device_buffers(ctx) -> set[int]:
    """Storage ids of the tensors (and list or dict members) their class allocates on a device through such a
    helper (`self.gpu_cache = self._allocate_kv_cache(n, device)`): device memory on a GPU."""
    return {sid for sid, _, _, kinds in _found(ctx) if "device" in kinds}


def host_buffers(ctx) -> dict[int, str]:
    """Storage id -> 'owner.attr' (or 'owner.attr[k]') of the tensors, and members of list or dict attributes,
    that their class allocates on the host through such a helper, unless the run asked to pin them."""
    from audit.scan.standins import pinned

    return {sid: label for sid, label, t, kinds in _found(ctx) if "host" in kinds and not pinned.asked(t)}
