"""The parsed source of a file and the def node of a running function, for everything that reads the step's
source (pin_flags, branch_flags, the detectors through detectors/source/lookup.py)."""

from __future__ import annotations

import ast
import functools
import linecache
import os

from audit.scan.sources.ast_nodes import all_nodes


__all__ = ["function_of", "tree"]


def tree(filename: str) -> ast.Module | None:
    """The parsed file; parsed again when it changed on disk (a long-lived process may rescan an edited file)."""
    linecache.checkcache(filename)
    try:
        st = os.stat(filename)
        stamp = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    return _parse(filename, stamp)


@functools.lru_cache(maxsize=512)
def _parse(filename: str, stamp) -> ast.Module | None:
    src = "".join(linecache.getlines(filename))
    if not src:
        return None
    try:
        return ast.parse(src, filename)
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
