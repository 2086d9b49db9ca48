"""What a statement reads off tensors, in its source: sizes, attributes, the locals it binds.

Pure AST questions that read_sizes (is this call downstream of a varying shape?) and passed_counters (does a
host position reach it through parameters?) both ask.
"""

from __future__ import annotations

import ast

from audit.detectors.source import grown_containers

_SIZE_CALLS = ("size", "numel", "dim")

_ARITH_MODULES = ("math", "operator")  # their functions compute on numbers, as the builtins do


def _is_size_read(n, skip: frozenset = frozenset()) -> bool:
    """A size read off a tensor; `len()` of a container the file grows (`skip`) is a host counter."""
    return isinstance(n, ast.Attribute) and n.attr == "shape" or isinstance(n, ast.Call) and (
        isinstance(n.func, ast.Attribute) and n.func.attr in _SIZE_CALLS
        or isinstance(n.func, ast.Name) and n.func.id == "len" and not grown_containers.container_len(n, skip))


def _tensor_made(node) -> bool:
    """The value is a method or module call (`torch.zeros(...)`, `x.new_empty(...)`): a tensor, whose names are
    not sizes handed on to the statement that reads the local."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not _is_size_read(node) \
        and not (isinstance(node.func.value, ast.Name) and node.func.value.id in _ARITH_MODULES)


def value_nodes(node):
    """The nodes of the expression read as values, outside its size reads: not inside `x.shape[0]` or `len(x)`,
    nor a method's name or a function called by name (`max`)."""
    todo = [node]
    while todo:
        n = todo.pop()
        if _is_size_read(n):
            continue
        if isinstance(n, ast.Call):
            todo += list(n.args) + [k.value for k in n.keywords]
            f = n.func
            if isinstance(f, ast.Attribute):
                todo.append(f.value)
            elif not isinstance(f, ast.Name):
                todo.append(f)
            continue
        yield n
        todo += list(ast.iter_child_nodes(n))


def _attrs_read(node) -> set:
    """Attribute names the expression loads as values, outside its size reads (`self.length` in
    `self.length + x.shape[0]`; not `cache` in `self.cache.size(0)`, nor a method called)."""
    return {n.attr for n in value_nodes(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)}


def _bound(func, names: set, before: int) -> list:
    """The values `func` assigns to `names` before line `before`. A tuple target takes the matching element of a
    tuple value (`device, dtype, n = t.device, t.dtype, t.shape[d]` binds `n` to `t.shape[d]`), or the whole
    value when it is not spelled out element by element (`b, n = x.shape[:2]`)."""
    out = []
    for a in ast.walk(func) if func is not None else ():
        if not isinstance(a, ast.Assign) or a.lineno >= before:
            continue
        for t in a.targets:
            if isinstance(t, ast.Name) and t.id in names:
                out.append(a.value)
            elif isinstance(t, (ast.Tuple, ast.List)):
                v = a.value
                elts = v.elts if isinstance(v, (ast.Tuple, ast.List)) and len(v.elts) == len(t.elts) \
                    and not any(isinstance(e, ast.Starred) for e in list(v.elts) + list(t.elts)) else None
                out += [elts[i] if elts is not None else v for i, e in enumerate(t.elts)
                        if isinstance(e, ast.Name) and e.id in names]
    return out
