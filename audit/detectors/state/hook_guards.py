"""Whether a hook's guard lets a given module through, when the guard is no `isinstance` test.

A process-wide hook (`register_module_forward_pre_hook`) or one a library hangs by name pattern often picks its
modules by what they carry, not their class: `if getattr(mod, "_adapter_name", None) is not None:`,
`if hasattr(mod, "lora_A"):`, `if type(mod).__name__ in TARGETS:`. Its statement then runs at the calls of those
modules only, and the target's call of one of them is the caller of what it changes. Such a test is evaluated
on the module of each hooked call, when it is made of reads alone (names, attributes, constants, comparisons,
`not`/`and`/`or`, subscripts and a few pure builtins); any other test, or one that raises, lets every module
through, as before.
"""

from __future__ import annotations

import ast

__all__ = ["passes"]

_PURE_CALLS = frozenset({"getattr", "hasattr", "isinstance", "issubclass", "type", "len", "callable", "str",
                         "bool", "id"})
_PURE_METHODS = frozenset({"startswith", "endswith", "lower", "upper", "get", "keys"})
_NODES = (ast.Expression, ast.BoolOp, ast.UnaryOp, ast.Compare, ast.Name, ast.Attribute, ast.Constant,
          ast.Subscript, ast.Tuple, ast.List, ast.Set, ast.Load, ast.And, ast.Or, ast.Not, ast.Eq, ast.NotEq,
          ast.Is, ast.IsNot, ast.In, ast.NotIn, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Call, ast.keyword,
          ast.Starred)


def _pure(test) -> bool:
    for n in ast.walk(test):
        if not isinstance(n, _NODES):
            return False
        if isinstance(n, ast.Call):
            f = n.func
            if not ((isinstance(f, ast.Name) and f.id in _PURE_CALLS)
                    or (isinstance(f, ast.Attribute) and f.attr in _PURE_METHODS)):
                return False
    return True


def passes(node: ast.If, line: int, param: str, mod, glob: dict) -> bool:
    """Whether the call of `mod` reaches `line` through the `if` `node` of a hook whose module parameter is
    `param` (True when the test cannot be read that way)."""
    test = node.test
    if not _pure(test) or not any(isinstance(n, ast.Name) and n.id == param for n in ast.walk(test)):
        return True
    try:
        code = compile(ast.Expression(test), "<hook guard>", "eval")
        value = bool(eval(code, dict(glob), {param: mod}))  # noqa: S307 - reads alone (_pure)
    except Exception:  # noqa: BLE001 - a test that cannot be evaluated here lets the module through
        return True
    in_body = node.body[0].lineno <= line <= node.body[-1].end_lineno
    return value if in_body else not value
