"""Tensors a class keeps as they came, while the same function sends a device copy of them on.

A VLM driver unpacks the processor's outputs (host tensors) and keeps the image grid for later
(`self.image_grid_thw = thw`), while the prefill gets `image_grid_thw=thw.to(device)`. The kept attribute is the
tensor before the move: host memory on a GPU too, so a get_rope_index-style read of it every step (`.tolist()`,
`.item()`) waits for nothing. On a CPU scan every tensor is on the CPU, and the factory that made it sits in
another module (the processor), so the `.to(device)` of the same name beside the assignment is the evidence.
A name rebound to a moved copy anywhere in the function (`thw = thw.to(device)`) proves nothing.
"""

from __future__ import annotations

import ast
import functools

from audit.detectors.source import scopes
from audit.detectors.source.lookup import tree
from audit.scan.sources.ast_nodes import all_nodes


def kept_before_move(filename: str, attr: str, lines: tuple[int, int] | None = None) -> bool:
    """Whether a function of the source (or of a span of it) assigns `self.<attr>` a name (or a constant-key
    entry of one, `inputs["image_grid_thw"]`) that the same function also sends to a device (`thw.to(device)`,
    `inputs.to(self.device)`, `.cuda()`), never rebinding that name to a moved copy."""
    t = tree(filename)
    return t is not None and _kept_before_move(t, attr, tuple(lines) if lines else None)


@functools.lru_cache(maxsize=4096)
def _kept_before_move(t: ast.Module, attr: str, lines) -> bool:
    """kept_before_move on a parsed file (keyed by the tree object: a file parsed again is asked again)."""
    for fn in all_nodes(t):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
                (lines and not lines[0] <= fn.lineno <= lines[1]):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Assign) or not any(
                    isinstance(x, ast.Attribute) and x.attr == attr for x in node.targets):
                continue
            base = _base_name(node.value)
            if base is not None and not _rebound_moved(fn, base) and _moved(t, fn, node.value, base):
                return True
    return False


def _base_name(value: ast.AST) -> str | None:
    """`thw` -> 'thw'; `inputs["image_grid_thw"]` -> 'inputs'; anything else -> None."""
    if isinstance(value, ast.Name):
        return value.id
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and \
            isinstance(value.slice, ast.Constant) and isinstance(value.slice.value, str):
        return value.value.id
    return None


def _moves(t: ast.Module, call: ast.AST) -> bool:
    return scopes.device_move(t, call, spelled=True)


def _moved(t: ast.Module, fn: ast.AST, value: ast.AST, base: str) -> bool:
    """The function sends the kept expression itself, or the whole container it came from, to a device."""
    want = {ast.dump(value), ast.dump(ast.Name(id=base, ctx=ast.Load()))}
    return any(_moves(t, c) and ast.dump(c.func.value) in want for c in ast.walk(fn))


def _rebound_moved(fn: ast.AST, name: str) -> bool:
    """The function binds `name` to something a move made (`thw = thw.to(device)`): then which tensor the
    attribute keeps depends on the order, and the source proves nothing."""
    for node in ast.walk(fn):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(x, ast.Name) and x.id == name for tg in targets for x in ast.walk(tg)) and \
                    node.value is not None and any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                                                   and c.func.attr in ("to", "cuda") for c in ast.walk(node.value)):
                return True
    return False
