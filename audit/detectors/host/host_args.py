"""Whether a name a wait in an untaken device branch reads holds host data, read from the source.

sentence-transformers' `_pad_tensor_list(tensors, lengths)` reads `int(lengths.max())` on its GPU side, but its one
caller passes `lengths = torch.tensor([t.shape[0] for t in tensors])`: a tensor built in host memory from Python
data, whose read waits for nothing. A name counts as host data when every assignment the read can see is a torch
builder naming no device (or the CPU) with no default device in force, or another such name; a parameter when
every call of its function in the same file passes such a value (a module function called by name, a method
through `self.`). Anything else (a parameter with no call in the file, a name assigned a device tensor) is unknown.
"""

from __future__ import annotations

import ast

from audit.detectors.source import lookup, mutations, scopes

__all__ = ["reads_host"]

_DEPTH = 2


def _host_value(file: str, tree, expr, line: int, depth: int) -> bool:
    if isinstance(expr, ast.Call):  # `torch.tensor([...])`, a factory naming no device (none in force) or the CPU
        return mutations._host_factory(file, expr)
    if isinstance(expr, ast.Name) and depth > 0:
        return _host_name(file, tree, expr, line, depth - 1)
    return False


def _params(func) -> list[str]:
    return [a.arg for a in func.args.posonlyargs + func.args.args]


def _passed(call: ast.Call, func, name: str, skip: int):
    """The expression `call` passes for parameter `name` of `func` (`skip` leading parameters bound already)."""
    params = _params(func)[skip:]
    for k in call.keywords:
        if k.arg == name:
            return k.value
    i = params.index(name) if name in params else -1
    return call.args[i] if 0 <= i < len(call.args) and not isinstance(call.args[i], ast.Starred) else None


def _calls_of(tree, func):
    """(call, parameters the call binds already) for each call of `func` in the file: by name for a module
    function, through `self.` / `cls.` for a method."""
    method = not any(func is d for d in tree.body)
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        if not method and isinstance(f, ast.Name) and f.id == func.name:
            yield n, 0
        elif method and isinstance(f, ast.Attribute) and f.attr == func.name and \
                isinstance(f.value, ast.Name) and f.value.id in ("self", "cls"):
            yield n, 1


def _host_name(file: str, tree, name: ast.Name, line: int, depth: int) -> bool:
    func = lookup.enclosing_function(file, line)
    if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and name.id in _params(func):
        calls = list(_calls_of(tree, func))
        return bool(calls) and all(
            (arg := _passed(c, func, name.id, skip)) is not None and _host_value(file, tree, arg, c.lineno, depth)
            for c, skip in calls)
    vals = scopes.values(tree, name, line)
    return bool(vals) and all(_host_value(file, tree, v, ln, depth) for v, ln in vals)


def reads_host(file: str, call: ast.Call) -> bool:
    """A wait (`int(x.max())`, `x.item()`, `x.tolist()`, `x.cpu()`) whose tensor `x` is a name holding host data."""
    target = call.func.value if isinstance(call.func, ast.Attribute) else None
    if isinstance(call.func, ast.Name) and call.args and isinstance(call.args[0], ast.Call) and \
            isinstance(call.args[0].func, ast.Attribute):
        target = call.args[0].func.value
    tree = lookup.tree(file)
    return isinstance(target, ast.Name) and tree is not None and _host_name(file, tree, target, call.lineno, _DEPTH)
