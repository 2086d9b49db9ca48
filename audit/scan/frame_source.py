"""The def node of a running function, for scan-time readers of the step's source (pin_flags, branch_flags)."""

from __future__ import annotations

import ast
import functools
import linecache

from audit.scan.ast_nodes import all_nodes


__all__ = ["function_of", "tree"]


@functools.lru_cache(maxsize=256)
def tree(filename: str):
    try:
        return ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None


def function_of(code):
    """The def node of a code object's function (None at module level, for a lambda or without source)."""
    t = tree(code.co_filename)
    for n in all_nodes(t) if t is not None else ():
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == code.co_name and \
                min([n.lineno] + [d.lineno for d in n.decorator_list]) == code.co_firstlineno:
            return n
    return None
