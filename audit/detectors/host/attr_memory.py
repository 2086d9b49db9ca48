"""How a class makes a tensor attribute, from its source: in pinned or pageable host memory, or elsewhere.

A host buffer kept on an object (a KV swap space, a staging buffer) is host memory on a GPU too, and only the
source says so on a CPU scan. Buffers that are pinned on request are often written as one conditional
expression (`torch.zeros(shape, pin_memory=True) if pin else torch.zeros(shape)`): each arm is a factory,
and the attribute is what its arms make when they agree; whether the run took the pinned arm is the storage's
own record (audit/scan/standins/pinned.py), not the source's.
"""

from __future__ import annotations

import ast

from audit.detectors.source.mutations import _field_factory, _host_computed, _host_factory
from audit.detectors.host.names import bound_values
from audit.detectors.source.lookup import tree
from audit.scan.sources.ast_nodes import nodes_of


def host_memory(filename: str, call, _depth: int = 0) -> str | None:
    """"pinned" / "pageable" for an expression that makes a host tensor, else None; a conditional expression
    makes what both its arms make ("pageable" when they differ only in a pin flag the source cannot settle)."""
    if isinstance(call, ast.Name) and _depth < 4:  # `inv = 1.0 / (base ** (torch.arange(...) / d))`, then `self.f = inv`
        kinds = {host_memory(filename, v, _depth + 1) for v in bound_values(filename, call) or [None]}
        return None if None in kinds else "pinned" if kinds == {"pinned"} else "pageable"
    if isinstance(call, ast.IfExp):
        arms = {host_memory(filename, call.body), host_memory(filename, call.orelse)}
        return None if None in arms else "pinned" if arms == {"pinned"} else "pageable"
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "pin_memory" \
            and _host_computed(filename, call.func.value):  # `torch.zeros(n).pin_memory()`
        return "pinned"
    if _host_factory(filename, call):
        return "pinned" if any(k.arg == "pin_memory" and isinstance(k.value, ast.Constant) and k.value.value
                               for k in call.keywords) else "pageable"
    if _host_computed(filename, call) and any(_host_factory(filename, n) for n in ast.walk(call)):
        return "pageable"  # `torch.randn(n, d) * 0.1`: a new tensor, in pageable memory (`= 0` makes no tensor)
    return None


def host_factory_attr(filename: str, attr: str, lines: tuple[int, int] | None = None) -> str | None:
    """How the source (or a span of it) makes `<x>.attr`: "pinned" / "pageable" when every assignment is
    a `torch.<factory>(...)` naming no device or the CPU (`pin_memory=True`: pinned), else None (never
    assigned that way, or also assigned something else: moved to a device, computed)."""
    t = tree(filename)
    kinds = set()
    for node in nodes_of(t, (ast.Assign, ast.AnnAssign)) if t is not None else ():
        if (lines and not lines[0] <= node.lineno <= lines[1]):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if node.value is None:
            continue
        if any(isinstance(x, ast.Name) and x.id == attr for x in targets) and (made := _field_factory(node.value)):
            call = made  # `temp: torch.Tensor = field(default_factory=lambda: torch.ones(1))` in a dataclass
        elif any(isinstance(x, ast.Attribute) and x.attr == attr for x in targets):
            call = node.value
        else:
            continue
        kind = host_memory(filename, call)
        if kind is None:
            return None
        kinds.add(kind)
    return kinds.pop() if len(kinds) == 1 else None


def host_factory_item(filename: str, attr: str, key: str, lines: tuple[int, int] | None = None) -> str | None:
    """As host_factory_attr, for the entry `key` of a dict attribute (`self.inputs = {"grid": torch.tensor(g),
    ...}`, `self.inputs["grid"] = ...`, `dict(grid=...)`): what every value the span gives that entry makes,
    else None (never given one, or also given a value that is not a host factory)."""
    t = tree(filename)
    kinds = set()
    for node in nodes_of(t, ast.Assign) if t is not None else ():
        if (lines and not lines[0] <= node.lineno <= lines[1]):
            continue
        for x in node.targets:
            if isinstance(x, ast.Attribute) and x.attr == attr:
                kinds |= {host_memory(filename, v) for v in _entry_values(node.value, key)}
            elif isinstance(x, ast.Subscript) and isinstance(x.value, ast.Attribute) and x.value.attr == attr \
                    and isinstance(x.slice, ast.Constant) and x.slice.value == key:
                kinds.add(host_memory(filename, node.value))
    return None if None in kinds or len(kinds) != 1 else kinds.pop()


def _entry_values(value, key: str) -> list:
    """The values a dict display or `dict(...)` call gives `key` ([None] for any other expression: unknown)."""
    if isinstance(value, ast.Dict):
        return [v for k, v in zip(value.keys, value.values) if isinstance(k, ast.Constant) and k.value == key]
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict" and not value.args:
        return [k.value for k in value.keywords if k.arg == key]
    return [None]
