"""Modules of an audit target: naming, resolving a dotted path, the layer list, source lines.

Bisection works on any nn.Module tree reachable from the target object (`target.model`,
`target.dec.net`, or the target itself when it is a module). Paths are dotted attribute paths
from the target, shortest first, the same names the CPU scan gives modules
("model.layers.2.attn"), so a capture finding and a scan finding can be matched by path.
"""

from __future__ import annotations

import inspect
from collections import deque

import torch
from torch import nn

from audit.errors import AuditError

__all__ = ["top_modules", "all_modules", "resolve_module", "module_device", "find_layers", "children_of",
           "source_info"]

_CONTAINERS = (nn.ModuleList, nn.ModuleDict)


def _join(a: str, b) -> str:
    return f"{a}.{b}" if a else str(b)


def top_modules(obj, max_depth: int = 4) -> list[tuple[str, nn.Module]]:
    """Modules reachable from obj without passing through another module, breadth first."""
    if isinstance(obj, nn.Module):
        return [("", obj)]
    from audit.capture.state import _user_object

    out, seen = [], {id(obj)}
    todo = deque([("", obj, 0)])
    while todo:
        path, o, depth = todo.popleft()
        items = []
        if isinstance(o, dict):
            items = list(o.items())
        elif isinstance(o, (list, tuple)):
            items = list(enumerate(o))
        elif o is obj or _user_object(o):
            items = list(vars(o).items())
        for k, v in items:
            if id(v) in seen:
                continue
            seen.add(id(v))
            p = _join(path, k)
            if isinstance(v, nn.Module):
                out.append((p, v))
            elif depth < max_depth and (isinstance(v, (dict, list, tuple)) or _user_object(v)):
                todo.append((p, v, depth + 1))
    return out


def all_modules(obj) -> dict[str, nn.Module]:
    """path -> module for every module of the target, each module once under its shortest path."""
    out, seen = {}, set()
    for top, mod in top_modules(obj):
        for name, m in mod.named_modules(prefix=top, remove_duplicate=False):
            if id(m) not in seen:
                seen.add(id(m))
                out[name] = m
    return out


def resolve_module(obj, path: str) -> nn.Module:
    """The module at a dotted path ("model.layers.2.attn"; integers index lists)."""
    cur = obj
    for part in [p for p in path.split(".") if p] if path else []:
        nxt = None
        if isinstance(cur, nn.Module) and part in cur._modules:
            nxt = cur._modules[part]
        elif isinstance(cur, (list, tuple)) and part.lstrip("-").isdigit():
            nxt = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            nxt = cur[part]
        else:
            nxt = getattr(cur, part, None)
        if nxt is None:
            raise AuditError(f"module path {path!r}: nothing named {part!r} in {type(cur).__name__}")
        cur = nxt
    if not isinstance(cur, nn.Module):
        raise AuditError(f"module path {path!r} names a {type(cur).__name__}, not an nn.Module")
    return cur


def module_device(m: nn.Module) -> torch.device | None:
    """Device of the module's first parameter or buffer (None for a module without tensors)."""
    for t in list(m.parameters(recurse=True))[:1] + list(m.buffers(recurse=True))[:1]:
        return t.device
    return None


def children_of(module: nn.Module, path: str) -> list[tuple[str, nn.Module]]:
    """Direct children, looking through ModuleList / ModuleDict (they hold modules, never run)."""
    out = []
    for name, child in module.named_children():
        p = _join(path, name)
        if isinstance(child, _CONTAINERS):
            out.extend(children_of(child, p))
        else:
            out.append((p, child))
    return out


def _params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def find_layers(obj, root: str | None = None, called: set | None = None) -> tuple[str, list[str]]:
    """(path of the layer list, paths of its layers).

    root: an explicit module whose children are the layers (--root). Otherwise the ModuleList
    whose children that ran in the step (`called`: ids of modules that ran) hold the most modules (a
    decoder's blocks, not the sublayers inside one block, nor an encoder that ran before the step; a wrapper
    list around the same blocks), then the most parameters, the most children that ran, and so on.
    """
    if root:
        mod = resolve_module(obj, root)
        return root, [p for p, _ in children_of(mod, root)]
    best, key = None, None
    for path, m in all_modules(obj).items():
        if not isinstance(m, (nn.ModuleList, nn.Sequential)) or len(m) == 0:
            continue
        kids = list(m)
        ran = [c for c in kids if called is None or id(c) in called]
        k = (sum(1 for c in ran for _ in c.modules()), sum(_params(c) for c in ran), len(ran),
             sum(_params(c) for c in kids), sum(1 for c in kids for _ in c.modules()), -path.count("."))
        if key is None or k > key:
            best, key = path, k
    if best is None:
        tops = top_modules(obj)
        if not tops:
            raise AuditError("the target holds no nn.Module: nothing to bisect (pass --root)")
        path, mod = tops[0]
        return path, [p for p, _ in children_of(mod, path)]
    return best, [_join(best, i) for i in range(len(resolve_module(obj, best)))]


def source_info(module: nn.Module, method: str | None) -> dict:
    """Where a person reads the module's code: the captured method's file:line, and the line
    ranges of every method its own classes define (to match scan findings inside the module)."""
    cls = type(module)
    info: dict = {"class": cls.__qualname__, "function": method, "file": None, "line": None, "ranges": []}
    target = getattr(cls, method, None) if method else None
    target = target or getattr(cls, "forward", None)
    try:
        lines, start = inspect.getsourcelines(target)
        info.update(file=inspect.getsourcefile(target), line=start, function=getattr(target, "__name__", method))
    except (TypeError, OSError):
        pass
    for klass in cls.__mro__:
        if (klass.__module__ or "").split(".")[0] == "torch" or klass is object:
            continue
        for attr in vars(klass).values():
            if inspect.isfunction(attr):
                try:
                    lines, start = inspect.getsourcelines(attr)
                    info["ranges"].append([inspect.getsourcefile(attr), start, start + len(lines) - 1])
                except (TypeError, OSError):
                    continue
    return info
