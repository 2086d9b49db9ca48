"""Where a piece of Python state is changed, from the source: statements that mutate an attribute
(directly, through a local alias or a helper's parameter), and attributes assigned host tensors.

The state snapshot says what changed between steps (audit/scan/state.py); these lookups name the
line a person has to change. Parsing is shared with _source (cached per file).
"""

from __future__ import annotations

import ast

from audit.detectors import _scopes
from audit.detectors._source import _FUNC, tree

MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "add", "discard",
            "setdefault", "popitem", "appendleft", "extendleft", "popleft", "sort", "reverse"}


def mutation_sites(filename: str, attr: str, lines: tuple[int, int] | None = None,
                   global_name: bool = False) -> list[tuple[int, str]]:
    """(line, function) of statements that mutate `<x>.attr` (or global `attr`) in a file or a span.

    Catches `x.attr = / += ...`, `x.attr[k][j] = ...`, `x.attr.append(...)` and friends, `del x.attr`,
    `setattr(x, "attr", ...)`, `next(x.attr)`, and the same through an alias of the attribute's value:
    a local bound from it (`req = self.requests[rid]; req["recent"][i] = t`) or the parameter of a
    function of the file that is called with it (`bump(self.stats, key)` -> `stats[key] += n`)."""
    t = tree(filename)
    if t is None:
        return []

    def rooted(n) -> bool:  # an expression whose value lives under `<x>.attr` (or the global)
        while isinstance(n, (ast.Subscript, ast.Call)) or (isinstance(n, ast.Attribute) and n.attr != attr):
            n = n.func.value if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) else \
                n.value if not isinstance(n, ast.Call) else None
            if n is None:
                return False
        if global_name:
            return isinstance(n, ast.Name) and n.id == attr
        return isinstance(n, ast.Attribute) and n.attr == attr

    params = _param_aliases(t, rooted)
    out = []
    for func in ast.walk(t):
        if not isinstance(func, _FUNC) or (lines and not (lines[0] <= func.lineno <= lines[1])):
            continue
        aliases = set(params.get(id(func), ())) | {
            x.id for node in ast.walk(func) if isinstance(node, ast.Assign) and rooted(node.value) and _same_object(node.value)
            for x in node.targets if isinstance(x, ast.Name)}

        def target(n) -> bool:
            sub = isinstance(n, ast.Subscript)
            while isinstance(n, ast.Subscript):
                n = n.value
            if isinstance(n, ast.Name) and n.id in aliases:
                return sub  # `req[k] = v` writes into the object; `req = ...` only rebinds the name
            if global_name:
                return isinstance(n, ast.Name) and n.id == attr
            return isinstance(n, ast.Attribute) and n.attr == attr

        for node in ast.walk(func):
            hit = False
            if isinstance(node, (ast.Assign, ast.Delete)):
                hit = any(target(x) for x in node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                hit = target(node.target)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                v = node.func.value
                hit = node.func.attr in MUTATORS and (target(v) or (isinstance(v, ast.Name) and v.id in aliases))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "next":
                hit = bool(node.args) and target(node.args[0])  # advancing an iterator / itertools.count
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
                hit = len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value == attr
            if hit:
                out.append((node.lineno, getattr(func, "name", "<lambda>")))
    return sorted(set(out))


def _same_object(value) -> bool:
    """An assigned expression that hands back the stored object itself (`x.attr`, `x.attr[k]`,
    `x.attr.get(k)`), not a new one (`x.attr.copy()`, `len(x.attr)`)."""
    while isinstance(value, (ast.Subscript, ast.Attribute, ast.Call)):
        if isinstance(value, ast.Call):
            if not (isinstance(value.func, ast.Attribute) and value.func.attr in ("get", "setdefault")):
                return False
            value = value.func.value
        else:
            value = value.value
    return True


def _param_aliases(t: ast.Module, rooted) -> dict[int, list[str]]:
    """id(function def) -> its parameters that some call in the file passes a value rooted at the
    attribute (by position or keyword; methods called as `self.f(...)` skip `self`)."""
    defs: dict[str, list] = {}
    for f in ast.walk(t):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defs.setdefault(f.name, []).append(f)
    out: dict[int, list[str]] = {}
    for call in ast.walk(t):
        if not isinstance(call, ast.Call):
            continue
        name = call.func.id if isinstance(call.func, ast.Name) else \
            call.func.attr if isinstance(call.func, ast.Attribute) else None
        for f in defs.get(name, ()):
            names = [a.arg for a in f.args.posonlyargs + f.args.args]
            if isinstance(call.func, ast.Attribute) and names and names[0] in ("self", "cls"):
                names = names[1:]
            hits = [names[i] for i, a in enumerate(call.args) if i < len(names) and rooted(a)]
            hits += [k.arg for k in call.keywords if k.arg and rooted(k.value)]
            if hits:
                out.setdefault(id(f), []).extend(hits)
    return out


def assigns_host_tensor(filename: str, attr: str, lines: tuple[int, int] | None = None) -> bool:
    """Whether the source (or a span of it) assigns `<x>.attr` a tensor it names the CPU for:
    `torch.zeros(..., device="cpu")`, `t.cpu()`, `t.to("cpu")` (a host tensor on a GPU too); the
    device may be a name assigned only the CPU (`device=self.host`)."""
    t = tree(filename)
    if t is None:
        return False
    for node in ast.walk(t):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or (lines and not lines[0] <= node.lineno <= lines[1]):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if not any(isinstance(x, ast.Attribute) and x.attr == attr for x in targets) or node.value is None:
            continue
        for call in ast.walk(node.value):
            if not isinstance(call, ast.Call):
                continue
            if isinstance(call.func, ast.Attribute) and call.func.attr == "cpu":
                return True
            if isinstance(call.func, ast.Attribute) and call.func.attr == "to" and call.args[:1] and \
                    _scopes.names_cpu(t, call.args[0], call.lineno):
                return True
            if any(k.arg == "device" and _scopes.names_cpu(t, k.value, call.lineno) for k in call.keywords):
                return True
    return False
