"""Statements that write inside one keyed element of a container (`self.stats["max_err"][name] = e`,
`self.stats["seen"].append(n)`), not the container itself.

A cpu-side-effect is sited from the source: every statement that mutates the attribute. When such a
statement names its element with a constant key and that element came out of the step equal (the
step's `max_err` table kept its values while `stats["calls"]` counted on), the statement changed
nothing the replay would miss, and it is no site of the change (`sites.unchanged_slot_line`).
"""

from __future__ import annotations

import ast

from audit.detectors.source.lookup import tree
from audit.detectors.source.assign_targets import written
from audit.scan.sources.ast_nodes import all_nodes


def _is_element(node, attr: str, key, global_name: bool) -> bool:
    """`<x>.attr[key]` (or `attr[key]` for a module global)."""
    if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == key):
        return False
    v = node.value
    return (isinstance(v, ast.Name) and v.id == attr) if global_name else (isinstance(v, ast.Attribute) and v.attr == attr)


def _strictly_inside(node, attr: str, key, global_name: bool) -> bool:
    """Whether `node` is a subscript or attribute chain over the element (`<x>.attr[key][i]`,
    `<x>.attr[key].total`), the element itself excluded."""
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
        if _is_element(node, attr, key, global_name):
            return True
    return False


def _within(node, attr: str, key, global_name: bool) -> bool:
    return _is_element(node, attr, key, global_name) or _strictly_inside(node, attr, key, global_name)


def writes_inside_element(filename: str, line: int, attr: str, key, global_name: bool = False) -> bool:
    """Whether every statement on `line` that writes through `<x>.attr` writes inside its element
    `[key]`: a store or `del` into it (`d["t"][k] = v`, `d["t"][k] += 1`), or a method called on it
    (`d["t"].append(v)`, `d["t"][k].add(v)`). Removing the element itself (`del d[0]`, which shifts a
    list) is not such a write."""
    t = tree(filename)
    found = False
    for node in all_nodes(t) if t is not None else ():
        if getattr(node, "lineno", None) != line or not isinstance(node, ast.stmt):
            continue
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            for x in written(node):
                if _strictly_inside(x, attr, key, global_name):
                    found = True
                elif isinstance(x, (ast.Subscript, ast.Attribute)) and _touches_attr(x, attr, global_name):
                    return False  # the container itself, or another of its elements
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                isinstance(node.value.func, ast.Attribute):
            recv = node.value.func.value
            if _within(recv, attr, key, global_name):
                found = True
            elif _touches_attr(recv, attr, global_name):
                return False
    return found


def _touches_attr(node, attr: str, global_name: bool) -> bool:
    """Whether a subscript or attribute chain is rooted at `<x>.attr` (or the global `attr`)."""
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        if not global_name and isinstance(node, ast.Attribute) and node.attr == attr:
            return True
        node = node.value
    return global_name and isinstance(node, ast.Name) and node.id == attr
