"""Whether a span of source places tensors on a device it is given (`device=device`, `.to(self.device)`,
`.cuda()`): code written for a GPU. There a factory that names no device (`torch.tensor(0.01)`) makes a
host tensor on purpose, on every machine. In code that never names a device it is a host tensor too,
unless the target put a default device in force (`factories.follows_default`): a plain object's small
attribute made so (`unplaced`) is host memory when nothing else stores that attribute; a module's may be
moved by `.to()`, and the target's own class is judged by its placements alone."""

from __future__ import annotations

import ast
import functools
import inspect

import torch

from audit.detectors.source import scopes
from audit.detectors.source.lookup import tree
from audit.scan.sources.ast_nodes import all_nodes, nodes_of


@functools.lru_cache(maxsize=512)
def sends_to_device(filename: str, lines: tuple[int, int] | None = None) -> bool:
    """A call in the span (or the file) that names a device other than the CPU: a `device=` keyword,
    `.to(<device>)` or `.cuda()`; a keyword or argument that names the CPU does not count."""
    t = tree(filename)
    for node in nodes_of(t, ast.Call) if t is not None else ():
        if (lines and not lines[0] <= node.lineno <= lines[1]):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr == "cuda":
            return True
        dev = [k.value for k in node.keywords if k.arg == "device"]
        if isinstance(node.func, ast.Attribute) and node.func.attr == "to" and node.args:
            dev.append(node.args[0])
        if any(_device_expr(d) and not scopes.names_cpu(t, d, node.lineno) for d in dev):
            return True
    return False


def _device_expr(n) -> bool:
    """A device as written: a name or attribute holding one (`device`, `self.device`, `x.device`), a string,
    or `torch.device(...)`; a dtype (`.to(torch.float16)`) or a tensor (`.to(other)`) is none."""
    if isinstance(n, ast.Constant):
        return isinstance(n.value, str)
    if isinstance(n, ast.Call):
        return ast.unparse(n.func) in ("torch.device", "device")
    name = n.attr if isinstance(n, ast.Attribute) else n.id if isinstance(n, ast.Name) else ""
    return "device" in name.lower() or name.lower() in ("dev", "gpu")


def unplaced(ctx, obj, name: str) -> bool:
    """A plain object (no module: `.to()` may move its tensors) whose class names no device at all, and whose
    attribute `name` the target's own code never stores: a tensor its class made with a factory naming no device
    (`self.t = torch.tensor(t)` in a temperature processor) stays where torch's default put it, host memory."""
    if isinstance(obj, torch.nn.Module) or obj is ctx.trace.objects[0][1]:
        return False
    own = ctx.own_files()
    return not any(isinstance(n, ast.Attribute) and n.attr == name and isinstance(n.ctx, ast.Store)
                   for f in own for n in ast.walk(tree(f) or ast.Module(body=[], type_ignores=[])))


_MOVERS = ("_apply", "to", "cuda")  # how nn.Module.to() reaches its tensors; a class overriding one may move more


def left_by_to(ctx, obj, name: str) -> bool:
    """A module's plain tensor attribute (neither parameter nor buffer): `module.to(device)` moves parameters
    and buffers only, so a tensor its class made with a factory naming no device (a streaming encoder's frame
    counter `self.offset = torch.zeros((), dtype=torch.long)` beside its registered tables) stays in host
    memory on a GPU. Not when a class of the hierarchy outside torch overrides how `.to()` moves tensors, nor
    when the target's own code stores that attribute outside the hierarchy's classes (a holder moving it:
    `blk.cache = blk.cache.to(device)`); an in-place update there (`+=`) stores nothing new."""
    if not isinstance(obj, torch.nn.Module) or name in obj._buffers or name in obj._parameters:
        return False
    if any(k in vars(c) for c in type(obj).__mro__ if not (c.__module__ or "").startswith("torch.") for k in _MOVERS):
        return False
    spans = class_spans(type(obj))
    for f in ctx.own_files():
        t = tree(f)
        if t is None:
            continue
        aug = {id(n.target) for n in all_nodes(t) if isinstance(n, ast.AugAssign)}
        if any(isinstance(n, ast.Attribute) and n.attr == name and isinstance(n.ctx, ast.Store) and id(n) not in aug
               and not any(sf == f and a <= n.lineno <= b for sf, (a, b) in spans) for n in all_nodes(t)):
            return False
    return True


@functools.lru_cache(maxsize=1024)
def class_spans(t: type) -> tuple:
    """(file, (first, last line)) of a class and its bases that have source."""
    spans = []
    for cls in t.__mro__:
        try:
            lines, start = inspect.getsourcelines(cls)
            spans.append((inspect.getsourcefile(cls), (start, start + len(lines))))
        except (OSError, TypeError):
            continue
    return tuple(x for x in spans if x[0])
